# Guest side of the idmap suite (idmap.setup.sh): what the guest sees of host
# owners, what its own ids become on the host, and that its root, host uid 100000,
# gets no more from host root's files than that user would. The guest kernel lets
# its root do anything; each refusal below comes from the host, through the daemon.
. /lib/vmtest.sh

D=$M/idmap
R=$D/root

owner() { stat -c %u:%g "$1"; }

t_host_owners_as_guest_sees_them() {
	eq "host 2000 (map)" "$(owner "$D/owned-2000")" 1000:1000
	eq "host 5003:5005 (squash-host)" "$(owner "$D/owned-5003")" 65534:65534
	eq "host 7000 (no rule)" "$(owner "$D/owned-7000")" 7000:7000
	eq "ls -n" "$(ls -n "$D/owned-2000" | awk '{print $3 ":" $4}')" 1000:1000
	eq "host root (no rule)" "$(owner "$R/prog")" 0:0
}

t_guest_creates_as_mapped_host_id() {
	fsops asuser 1000 1000 fsops open "$D/by-1000" wc
	fsops asuser 1000 1000 mkdir "$D/dir-1000"
	eq "guest view of its file" "$(owner "$D/by-1000")" 1000:1000
	eq "guest view of its dir" "$(owner "$D/dir-1000")" 1000:1000
	host_ok owner idmap/by-1000 2000:2000
	host_ok owner idmap/dir-1000 2000:2000
	echo root >"$D/by-root"
	eq "guest view of root's file" "$(owner "$D/by-root")" 0:0
	host_ok owner idmap/by-root 100000:100000
}

t_chown_translates() {
	echo x >"$D/given"
	chown 0:0 "$D/given"
	host_ok owner idmap/given 100000:100000
	eq "guest view" "$(owner "$D/given")" 0:0
	# Host uid 100000 may not give its file away: not to guest 1000 (host 2000),
	# nor to a host id outside the map.
	fails chown 1000:1000 "$D/given"
	fails chown 7000 "$D/given"
	host_ok owner idmap/given 100000:100000
}

t_forbidden_guest_id() {
	eq "create as 3000" "$(fsops asuser 3000 3000 fsops -e open "$D/by-3000" wc)" EPERM
	eq "mkdir as 3000" "$(fsops asuser 3000 3000 fsops -e mkdir "$D/dir-3000")" EPERM
	host_ok absent idmap/by-3000
	fails chown 3000 "$D/given"
	host_ok owner idmap/given 100000:100000
	eq "3000 may still read" "$(fsops asuser 3000 3000 cat "$D/owned-7000")" host-7000
}

t_translated_root_refused_on_host_root_files() {
	eq "chmod 04755 of host root's program" "$(fsops -e chmod 04755 "$R/prog")" EPERM
	eq "write into host root's 0644 file" "$(fsops -e open "$R/conf" w)" EACCES
	eq "append to it" "$(fsops -e open "$R/conf" a)" EACCES
	eq "truncate it" "$(fsops -e truncate "$R/conf" 0)" EACCES
	fails chown 0:0 "$R/conf"
	eq "create in host root's 0755 dir" "$(fsops -e open "$R/dir/new" wc)" EACCES
	eq "mkdir there" "$(fsops -e mkdir "$R/dir/sub")" EACCES
	eq "symlink there" "$(fsops -e symlink x "$R/dir/ln")" EACCES
	eq "hard link of host root's secret" "$(fsops -e link "$R/secret" "$D/stolen")" \
		"$(cat "$D/link-expect")"
	eq "read host root's secret" "$(fsops -e open "$R/secret" r)" EACCES
	eq "trusted.* xattr" "$(fsops -e setxattr "$R/conf" trusted.x y)" EPERM
	eq "POSIX ACL of another's file" "$(fsops -e acl set "$R/conf" access u::rw,g::r,o::r)" EPERM
	eq "unlink another's file in a sticky dir" "$(fsops -e unlink "$D/tmp/theirs")" EPERM
	host_ok mode idmap/root/prog 755
	host_ok owner idmap/root/prog 0:0
	host_ok content idmap/root/conf host-root
	host_ok mode idmap/root/conf 644
	host_ok owner idmap/root/conf 0:0
	host_ok absent idmap/root/dir/new
	host_ok absent idmap/root/dir/sub
	host_ok content idmap/tmp/theirs host-7000
}

t_translated_root_owns_its_own() {
	echo mine >"$D/mine"
	chmod 04755 "$D/mine"
	host_ok mode idmap/mine 4755
	host_ok owner idmap/mine 100000:100000
	fsops utimens "$D/mine" 1000000 1000000
	echo two >>"$D/mine"
	# Its own write, without CAP_FSETID on the host, cleared setuid.
	host_ok mode idmap/mine 755
	ln "$D/mine" "$D/mine-link"
	mv "$D/mine-link" "$D/tmp/mine-link"
	rm "$D/tmp/mine-link"
	host_ok size idmap/mine 9
}

t_non_owner_write_clears_setuid() {
	# suid-1 is host 100001's, 06777: guest root writes it as host 100000.
	fsops write "$D/suid-1" y
	host_ok mode idmap/suid-1 777
}

run host-owners-as-the-guest-sees-them t_host_owners_as_guest_sees_them
run guest-creates-as-mapped-host-id t_guest_creates_as_mapped_host_id
run chown-translates t_chown_translates
run forbidden-guest-id-eperm t_forbidden_guest_id
run translated-root-refused-on-host-root-files t_translated_root_refused_on_host_root_files
run translated-root-owns-its-own t_translated_root_owns_its_own
run non-owner-write-clears-setuid t_non_owner_write_clears_setuid
