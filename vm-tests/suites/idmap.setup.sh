#!/usr/bin/env bash
# Host setup of the idmap suite: uids and gids translated by the daemon
# (--translate-uid/--translate-gid, virtiofsd's rules):
#   guest 1000 <-> host 2000 (map), guest 3000 forbidden (forbid-guest),
#   host 5000..5009 shown as guest 65534 (squash-host); every other id is itself.
#   idmap.setup.sh SHARED_DIR
set -euo pipefail
S=${1:?usage: idmap.setup.sh SHARED_DIR}
rm -rf "${S:?}"/idmap && mkdir -p "$S/idmap" && chmod 0777 "$S/idmap"
echo host-2000 >"$S/idmap/owned-2000" && chown 2000:2000 "$S/idmap/owned-2000"
echo host-5003 >"$S/idmap/owned-5003" && chown 5003:5005 "$S/idmap/owned-5003"
echo host-7000 >"$S/idmap/owned-7000" && chown 7000:7000 "$S/idmap/owned-7000"
printf '%s\n' --translate-uid=map:1000:2000:1 --translate-gid=map:1000:2000:1 \
	--translate-uid=forbid-guest:3000:1 --translate-gid=forbid-guest:3000:1 \
	--translate-uid=squash-host:5000:65534:10 --translate-gid=squash-host:5000:65534:10 \
	>"$VMTEST_DAEMON_ARGS_FILE"
