#!/usr/bin/env bash
# Host checks of the two-sandbox suite, after B's VM (the last of the two) has
# exited: pair-b.host.sh SHARED_DIR (B's share; the volume is SHARED_DIR/vol).
# The volume holds what A wrote and nothing from B, and no lock of either
# guest is left on it.
set -uo pipefail

V=${1:?usage: pair-b.host.sh SHARED_DIR}/vol

pass() { echo "VMTEST PASS $1"; }
fail() { echo "VMTEST FAIL $1: $2"; }

# .pair: the markers; the others: JuiceFS's virtual files at its root.
files=$(cd "$V" && find . \( -path ./.pair -o -path ./.accesslog -o -path ./.config -o -path ./.stats -o -path ./.trash \) \
	-prune -o -print | sort | tr '\n' ' ')
want=". ./big ./lk-kill ./lk-ofd ./lk-posix ./lk-wait ./mm ./seen ./x "
if [[ $files == "$want" ]]; then
	pass host-volume-holds-only-a-s-files
else
	fail host-volume-holds-only-a-s-files "files: '$files', want '$want'"
fi

got=$(head -c 11 "$V/mm"; echo "|$(head -c 7 "$V/seen")|$(tr -d a <"$V/x" | wc -c)")
if [[ $got == "mapped-by-A|round-3|0" ]]; then
	pass host-sees-a-s-data
else
	fail host-sees-a-s-data "mm|seen|non-a bytes in x: '$got', want 'mapped-by-A|round-3|0'"
fi

# A POSIX write lock from the host conflicts with the daemons' OFD locks, and an
# flock with their flocks: both must be free now.
leftover=""
for f in lk-posix lk-ofd lk-wait lk-kill; do
	python3 - "$V/$f" <<-'PY' || leftover="$leftover $f"
		import fcntl, sys
		with open(sys.argv[1], "r+") as f:
		    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
		    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
	PY
done
if [[ -z $leftover ]]; then
	pass host-no-lock-left
else
	fail host-no-lock-left "still locked:$leftover"
fi
