#!/usr/bin/env bash
# Host setup of the idmap suite: uids and gids translated by the daemon
# (--translate-uid/--translate-gid, virtiofsd's rules):
#   guest 0..999 <-> host 100000..100999 (map): the guest's root is an unprivileged
#     host user, which may do to host files only what that user may;
#   guest 1000 <-> host 2000 (map), guest 3000 forbidden (forbid-guest),
#   host 5000..5009 shown as guest 65534 (squash-host); every other id is itself.
# Host root's files and directories are planted for the translated-root checks.
#   idmap.setup.sh SHARED_DIR
set -euo pipefail
S=${1:?usage: idmap.setup.sh SHARED_DIR}
rm -rf "${S:?}"/idmap && mkdir -p "$S/idmap" && chmod 0777 "$S/idmap"
# The share's root is host root's 0755: the guest's root (host 100000) may not
# write there, so the guest/host handshake directory is made writable first.
mkdir -p "$S/.sync" && chmod 0777 "$S/.sync"
echo host-2000 >"$S/idmap/owned-2000" && chown 2000:2000 "$S/idmap/owned-2000"
echo host-5003 >"$S/idmap/owned-5003" && chown 5003:5005 "$S/idmap/owned-5003"
echo host-7000 >"$S/idmap/owned-7000" && chown 7000:7000 "$S/idmap/owned-7000"
# Host root's: a 0755 program, a 0644 file, a 0600 secret, a 0755 directory.
R=$S/idmap/root
mkdir -p "$R" && chmod 0755 "$R"
echo host-root >"$R/prog" && chmod 0755 "$R/prog"
echo host-root >"$R/conf" && chmod 0644 "$R/conf"
echo host-root >"$R/secret" && chmod 0600 "$R/secret"
mkdir "$R/dir" && chmod 0755 "$R/dir"
# A sticky world-writable directory holding another host user's file.
mkdir "$S/idmap/tmp" && chmod 1777 "$S/idmap/tmp"
echo host-7000 >"$S/idmap/tmp/theirs" && chown 7000:7000 "$S/idmap/tmp/theirs"
# A world-writable setuid file of guest uid 1 (host 100001).
echo x >"$S/idmap/suid-1" && chown 100001:100001 "$S/idmap/suid-1" && chmod 06777 "$S/idmap/suid-1"
# What the host answers uid 100000 hard-linking host root's secret.
if [[ $(cat /proc/sys/fs/protected_hardlinks 2>/dev/null || echo 1) == 1 ]]; then
	echo EPERM >"$S/idmap/link-expect"
else
	echo OK >"$S/idmap/link-expect"
fi
printf '%s\n' --translate-uid=map:0:100000:1000 --translate-gid=map:0:100000:1000 \
	--translate-uid=map:1000:2000:1 --translate-gid=map:1000:2000:1 \
	--translate-uid=forbid-guest:3000:1 --translate-gid=forbid-guest:3000:1 \
	--translate-uid=squash-host:5000:65534:10 --translate-gid=squash-host:5000:65534:10 \
	--xattr --allow-privileged-xattrs \
	>"$VMTEST_DAEMON_ARGS_FILE"
