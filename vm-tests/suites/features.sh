# Guest side of the features suite (features.setup.sh: --posix-acl
# --allow-direct-io --cache=metadata). Users 1000, 1001 are guest processes run
# with fsops asuser; the host hook checks the host side of each step.
. /lib/vmtest.sh

F=$M/feat

# as UID CMD...: a command as UID:UID without supplementary groups
as() { _u=$1; shift; fsops asuser "$_u" "$_u" "$@"; }

# An ACL entry for a named user opens a file its mode closes, the guest kernel
# enforcing it (FUSE_POSIX_ACL) as well as the host.
t_acl_named_user() {
	echo secret >"$F/acl-f"
	chmod 0600 "$F/acl-f"
	eq "1000 before the ACL" "$(as 1000 fsops -e open "$F/acl-f" r)" EACCES
	fsops acl set "$F/acl-f" access "u::rw,u:1000:r,g::-,m::r,o::-"
	eq "ACL read back" "$(fsops acl get "$F/acl-f" access)" "u::rw,u:1000:r,g::-,m::r,o::-"
	host_ok acl feat/acl-f access "u::rw,u:1000:r,g::-,m::r,o::-"
	eq "mode shows the mask" "$(fsops mode "$F/acl-f")" 0640
	eq "1000 reads" "$(as 1000 fsops -e open "$F/acl-f" r)" OK
	eq "1000 reads the data" "$(as 1000 cat "$F/acl-f")" secret
	eq "1000 may not write" "$(as 1000 fsops -e open "$F/acl-f" w)" EACCES
	eq "1001 has no entry" "$(as 1001 fsops -e open "$F/acl-f" r)" EACCES
}

# chmod rewrites the ACL's mask, which then limits the named user.
t_acl_mask_follows_chmod() {
	chmod 0600 "$F/acl-f"
	eq "ACL after chmod" "$(fsops acl get "$F/acl-f" access)" "u::rw,u:1000:r,g::-,m::-,o::-"
	eq "1000 masked out" "$(as 1000 fsops -e open "$F/acl-f" r)" EACCES
	chmod 0640 "$F/acl-f"
	eq "1000 back in" "$(as 1000 fsops -e open "$F/acl-f" r)" OK
}

# Only the owner changes an ACL; removing it returns the plain mode bits.
t_acl_owner_only() {
	eq "non-owner set" "$(as 1000 fsops -e acl set "$F/acl-f" access "u::rw,u:1000:rw,g::-,m::rw,o::-")" EPERM
	eq "ACL unchanged" "$(fsops acl get "$F/acl-f" access)" "u::rw,u:1000:r,g::-,m::r,o::-"
	fsops acl remove "$F/acl-f" access
	eq "1000 without the ACL" "$(as 1000 fsops -e open "$F/acl-f" r)" EACCES
	host_ok mode feat/acl-f 640
}

# A directory's default ACL is inherited by what is created in it, and the
# creator's umask does not apply there (FUSE_DONT_MASK); elsewhere it does.
t_default_acl_inherited() {
	mkdir "$F/acl-d"
	fsops acl set "$F/acl-d" default "u::rwx,u:1000:rwx,g::rx,m::rwx,o::-"
	(umask 077 && echo new >"$F/acl-d/new" && mkdir "$F/acl-d/sub")
	eq "file's ACL" "$(fsops acl get "$F/acl-d/new" access)" "u::rw,u:1000:rwx,g::rx,m::rw,o::-"
	eq "file's mode" "$(fsops mode "$F/acl-d/new")" 0660
	host_ok acl feat/acl-d/new access "u::rw,u:1000:rwx,g::rx,m::rw,o::-"
	eq "sub's default ACL" "$(fsops acl get "$F/acl-d/sub" default)" "u::rwx,u:1000:rwx,g::rx,m::rwx,o::-"
	eq "1000 writes in sub" "$(as 1000 fsops -e open "$F/acl-d/sub/by-1000" wc)" OK
	(umask 027 && echo plain >"$F/plain" && mkdir "$F/plain-d")
	eq "umask on a file" "$(fsops mode "$F/plain")" 0640
	eq "umask on a dir" "$(fsops mode "$F/plain-d")" 0750
	host_ok mode feat/plain 640
}

# openwait_bg FILE MODE GOFILE: holds FILE open in the background until GOFILE.
openwait_bg() {
	rm -f "$3" /tmp/openwait.out
	fsops openwait "$1" "$2" "$3" >/tmp/openwait.out &
	for _i in $(seq 500); do
		[ -s /tmp/openwait.out ] && return 0
		usleep 10000
	done
	die "openwait $1 $2 did not open"
}

# The guest's O_DIRECT reaches the host's open (--allow-direct-io); an open
# without it does not get it.
t_direct_io_reaches_host() {
	dd if=/dev/zero of="$F/dio" bs=4096 count=4 2>/dev/null
	openwait_bg "$F/dio" direct-r "$F/.dio-go"
	host_ok directio feat/dio yes
	touch "$F/.dio-go"
	wait
	openwait_bg "$F/dio" r "$F/.dio-go"
	host_ok directio feat/dio no
	touch "$F/.dio-go"
	wait
	fsops pattern write "$F/dio2" 4 7 direct
	fsops pattern verify "$F/dio2" 4 7 direct
}

# cache=metadata: the guest keeps attributes, never data.
t_metadata_cached_data_not() {
	echo v1 >"$F/meta"
	chmod 0644 "$F/meta"
	eq "first read" "$(cat "$F/meta")" v1
	eq "first mode" "$(fsops mode "$F/meta")" 0644
	ls "$F" >/dev/null
	host_ok modify feat/meta v2
	host_ok chmod 600 feat/meta
	host_ok create feat/late host-made
	# Attributes first: a read invalidates the guest's atime, and its next stat
	# then fetches every attribute anew (the guest kernel's rule, the same with
	# virtiofsd).
	eq "attributes kept" "$(fsops mode "$F/meta")" 0644
	# Whether a kept listing is read again is the guest kernel's choice (it
	# checks the directory's mtime with AUTO_INVAL_DATA): recorded, not asserted.
	info "cache=metadata: a host-created name in a listed directory listed at once: $(ls "$F" | grep -c '^late$')"
	eq "data read anew" "$(cat "$F/meta")" v2
	eq "lookup by name still works" "$(cat "$F/late")" host-made
}

run acl-named-user-entry t_acl_named_user
run acl-mask-follows-chmod t_acl_mask_follows_chmod
run acl-owner-only t_acl_owner_only
run acl-default-inherited-umask-elsewhere t_default_acl_inherited
run direct-io-reaches-host t_direct_io_reaches_host
run cache-metadata-attrs-not-data t_metadata_cached_data_not
