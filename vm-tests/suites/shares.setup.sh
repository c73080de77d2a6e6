#!/usr/bin/env bash
# Host setup of the shares suite, run by run-vm.sh before the first boot:
#   shares.setup.sh SHARED_DIR
# SharedDir gets a (rw), b (ro), c (rw) and hidden (not allowed, holds a
# secret). Host symlinks in a point at the secret and out of the share; the
# guest must never see the secret. Writes the daemon arguments to
# $VMTEST_DAEMON_ARGS_FILE and b's checksums to $VMTEST_WORK/b.manifest for
# shares.host.sh.
set -euo pipefail

S=${1:?usage: shares.setup.sh SHARED_DIR}
# Built from two parts so that the guest suite, which holds the same two
# parts, never contains the whole string.
SECRET="VOLFSD-HIDDEN-""SECRET-5f9c2e71"

rm -rf "${S:?}"/{a,b,c,hidden}
mkdir -p "$S"/{a,b,c,hidden}

printf '%s\n' "$SECRET" >"$S/hidden/secret"
chmod 0644 "$S/hidden/secret"
mkdir "$S/hidden/dir" && printf '%s in a dir\n' "$SECRET" >"$S/hidden/dir/secret2"

# b: read-only share with known content.
printf 'read-only share b\n' >"$S/b/readme.txt"
mkdir -p "$S/b/sub" "$S/b/emptydir"
printf 'nested in b\n' >"$S/b/sub/nested.txt"
head -c 65536 /dev/urandom >"$S/b/random.bin"
ln -s readme.txt "$S/b/link-to-readme"
touch -d @1577934245 "$S/b/readme.txt"

# a: read-write share.
printf 'file f in a\n' >"$S/a/f"
printf 'file g in a, moved to c by the guest\n' >"$S/a/g"
printf 'to be removed\n' >"$S/a/rm-me"
mkdir "$S/a/d1"
for i in 0 1 2 3 4 5 6 7; do printf 'd-content-%s\n' "$i" >"$S/a/d1/f$i"; done
mkdir "$S/a/d1/inner" && printf 'inner\n' >"$S/a/d1/inner/x"

# The symlinks the guest must resolve in its own namespace.
ln -s ../hidden/secret "$S/a/to-secret"
ln -s /etc/hostname "$S/a/to-etc"
ln -s / "$S/a/to-root"
ln -s "$S/hidden/secret" "$S/a/to-abs"
ln -s ../../hidden "$S/a/d1/to-hidden-dir"
# What the guest compares against (it cannot know the host's paths/names).
printf '%s\n' "$S/hidden/secret" >"$S/a/abs-link-target.txt"
cat /etc/hostname >"$S/a/host-hostname.txt" 2>/dev/null || hostname >"$S/a/host-hostname.txt"

# c: read-write share, target of the cross-share mv.
printf 'c share\n' >"$S/c/c-file"

(cd "$S/b" && find . -printf '%y %p %m %s %T@ %l\n' | sort) >"$VMTEST_WORK/b.manifest"
(cd "$S/b" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$VMTEST_WORK/b.sha256"

printf '%s\n' --allowed-dir a --allowed-dir b:ro --allowed-dir c >"$VMTEST_DAEMON_ARGS_FILE"
echo "shares setup done in $S"
