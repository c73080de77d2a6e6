#!/usr/bin/env bash
# Host setup of the upgrade suite, run by run-vm.sh before the boot:
#   upgrade.setup.sh SHARED_DIR
# volfsd is upgraded under the running guest (--upgradable, docs/UPGRADE.md). An
# upgrade runs the binary found at the path the daemon was started from, so the
# daemon starts from a copy in $VMTEST_WORK/bin/volfsd that upgrade.hook.sh
# replaces (renames in, as a package upgrade does) before each upgrade with one of:
#   volfsd.same     the binary under test, unchanged
#   volfsd.other    the same binary with another version string: the version
#                   (CARGO_PKG_VERSION, the string clap's --version prints)
#                   patched in place to a string of the same length, e.g. 0.1.0 ->
#                   9.9.9. Cargo sets CARGO_PKG_VERSION itself (no override at
#                   build time), and a second release build costs minutes of CI;
#                   the patched copy is the same code under another version
#                   string. The patch requires exactly one occurrence of the
#                   string and checks --version. Not patched: the device state's
#                   written_by ("volfsd 0.1.0" in the log's "device state loaded"
#                   lines), which the compiler builds from immediates in the code.
#   volfsd.exit3    a "new binary" that exits at once with status 3
#   volfsd.refuse   a wrapper that runs volfsd.same on another shared dir, with
#                   an empty upg/, and --migration-on-error=abort (given last,
#                   they win): it starts, but refuses the state (the guest's held
#                   nodes are not there)
# Also builds fsops for the host ($VMTEST_WORK/fsops-host: lockwatch), and gives
# the daemon --upgradable, a control socket (for `volfsd ctl upgrade`), the
# volume upg (SHARE/upg: with a control socket the guest's root holds only the
# volumes) and --migration-on-error=guest-error: the metadata loop unlinks files
# the guest may still hold (until its FORGET), and such a node has no path for the
# state, so with the default (abort) the new process refuses the whole state and
# the upgrade fails (the old process serves on; 1 of 50 upgrades did here); here
# the new process marks the node lost instead (ESTALE, should the guest use it: it
# does not). The loads' "lost N nodes" are counted by upgrade.host.sh.
# docs/UPGRADE.md, what is left.
set -euo pipefail

S=${1:?usage: upgrade.setup.sh SHARED_DIR}
W=${VMTEST_WORK:?}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=${VMTEST_DAEMON:?}
B=$W/bin

"$SRC" --help 2>&1 | grep -q -- --upgradable || { echo "$SRC has no --upgradable"; exit 1; }
# VMTEST_FSOPS_HOST: built already (a nested run builds it outside L1, where gcc
# is fast).
if [[ -x ${VMTEST_FSOPS_HOST:-} ]]; then
	cp "$VMTEST_FSOPS_HOST" "$W/fsops-host"
else
	gcc -O2 -Wall -o "$W/fsops-host" "$HERE/../guest/fsops.c"
fi
mkdir -p "$B" "$W/empty-share/upg" "$S/upg"
cp "$SRC" "$B/volfsd.same"

version=$("$SRC" --version | awk '{print $2}')
[[ $version =~ ^[0-9][0-9.]*$ ]] || { echo "unexpected version '$version' from $SRC --version"; exit 1; }
other=$(tr 0-9 9 <<<"$version")
[[ $other != "$version" ]] || other=$(tr 0-9 8 <<<"$version")
count=$(grep -a -o -F "$version" "$SRC" | wc -l)
if [[ $count != 1 ]]; then
	echo "the version string $version occurs $count times in $SRC (want exactly 1 to patch it honestly):"
	echo "build the other binary instead, e.g. with another version in Cargo.toml"
	exit 1
fi
python3 - "$SRC" "$B/volfsd.other" "$version" "$other" <<'PY'
import sys
src, dst, old, new = sys.argv[1:]
data = open(src, "rb").read()
assert data.count(old.encode()) == 1 and len(old) == len(new)
open(dst, "wb").write(data.replace(old.encode(), new.encode()))
PY
chmod 0755 "$B/volfsd.other"
got=$("$B/volfsd.other" --version)
[[ $got == "volfsd $other" ]] || { echo "the patched copy says '$got', want 'volfsd $other'"; exit 1; }

printf '#!/bin/sh\necho "volfsd.exit3: exiting at once" >&2\nexit 3\n' >"$B/volfsd.exit3"
printf '#!/bin/sh\nexec %q "$@" --shared-dir=%q --migration-on-error=abort\n' \
	"$B/volfsd.same" "$W/empty-share" >"$B/volfsd.refuse"
chmod 0755 "$B/volfsd.exit3" "$B/volfsd.refuse"

cp "$B/volfsd.same" "$B/volfsd"
echo "$B/volfsd" >"${VMTEST_DAEMON_BIN_FILE:?}"
{
	echo --upgradable
	echo "--control-socket=$W/ctl.sock"
	echo "--allowed-dir=upg"
	echo "--migration-on-error=guest-error"
} >>"${VMTEST_DAEMON_ARGS_FILE:?}"
echo "$version" >"$B/version.same"
echo "$other" >"$B/version.other"
echo "upgrade setup done: $B (versions $version and $other), share $S"
