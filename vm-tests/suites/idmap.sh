# Guest side of the idmap suite (idmap.setup.sh): what the guest sees of host
# owners, and what its own ids become on the host.
. /lib/vmtest.sh

D=$M/idmap

owner() { stat -c %u:%g "$1"; }

t_host_owners_as_guest_sees_them() {
	eq "host 2000 (map)" "$(owner "$D/owned-2000")" 1000:1000
	eq "host 5003:5005 (squash-host)" "$(owner "$D/owned-5003")" 65534:65534
	eq "host 7000 (no rule)" "$(owner "$D/owned-7000")" 7000:7000
	eq "ls -n" "$(ls -n "$D/owned-2000" | awk '{print $3 ":" $4}')" 1000:1000
}

t_guest_creates_as_mapped_host_id() {
	fsops asuser 1000 1000 fsops open "$D/by-1000" wc
	fsops asuser 1000 1000 mkdir "$D/dir-1000"
	eq "guest view of its file" "$(owner "$D/by-1000")" 1000:1000
	eq "guest view of its dir" "$(owner "$D/dir-1000")" 1000:1000
	host_ok owner idmap/by-1000 2000:2000
	host_ok owner idmap/dir-1000 2000:2000
	echo root >"$D/by-root"
	host_ok owner idmap/by-root 0:0
}

t_chown_translates() {
	echo x >"$D/given"
	chown 1000:1000 "$D/given"
	host_ok owner idmap/given 2000:2000
	eq "guest view" "$(owner "$D/given")" 1000:1000
	chown 7000:7000 "$D/given"
	host_ok owner idmap/given 7000:7000
}

t_forbidden_guest_id() {
	eq "create as 3000" "$(fsops asuser 3000 3000 fsops -e open "$D/by-3000" wc)" EPERM
	eq "mkdir as 3000" "$(fsops asuser 3000 3000 fsops -e mkdir "$D/dir-3000")" EPERM
	host_ok absent idmap/by-3000
	fails chown 3000 "$D/given"
	host_ok owner idmap/given 7000:7000
	eq "3000 may still read" "$(fsops asuser 3000 3000 cat "$D/owned-7000")" host-7000
}

run host-owners-as-the-guest-sees-them t_host_owners_as_guest_sees_them
run guest-creates-as-mapped-host-id t_guest_creates_as_mapped_host_id
run chown-translates t_chown_translates
run forbidden-guest-id-eperm t_forbidden_guest_id
