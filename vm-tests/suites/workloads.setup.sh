#!/usr/bin/env bash
# Host setup of the workloads suite, run by run-vm.sh before the first boot:
#   workloads.setup.sh SHARED_DIR
# Builds (or takes from build/workloads/) the suite's inputs with
# vm-tests/workloads-inputs.py and attaches them to the guest as two read-only
# virtio-blk disks, wl-tree (the source tree, a tar) and wl-inputs (params and
# the storm's packages), through $VMTEST_VMM_ARGS_FILE (QEMU only).
# Sizes (environment; the defaults are the CI size):
#   VMTEST_WORKLOADS_FILES     files of the source tree (500; full size 50000)
#   VMTEST_WORKLOADS_PACKAGES  npm packages of the storm (15; the lock has 461)
#   VMTEST_WORKLOADS_TX        SQLite transactions (5)
#   VMTEST_WORKLOADS_ROWS      inserts per transaction (20)
# Installs npm (Debian's) and python3 if missing. What the inputs are goes to
# $VMTEST_LOG_DIR/workloads-inputs.txt (the bench keeps it).
set -euo pipefail

S=${1:?usage: workloads.setup.sh SHARED_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

need() { # need COMMAND PACKAGE: apt-get install PACKAGE if COMMAND is missing
	command -v "$1" >/dev/null && return 0
	[[ $(id -u) == 0 ]] || { echo "workloads.setup: $1 missing (package $2) and not root" >&2; exit 1; }
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2"
}
need python3 python3
need npm npm
need dpkg-deb dpkg

out=$(python3 "$HERE/workloads-inputs.py" \
	--files "${VMTEST_WORKLOADS_FILES:-500}" --packages "${VMTEST_WORKLOADS_PACKAGES:-15}" \
	--tx "${VMTEST_WORKLOADS_TX:-5}" --rows "${VMTEST_WORKLOADS_ROWS:-20}")
tree=$(awk '$1 == "tree" {print $2}' <<<"$out")
inputs=$(awk '$1 == "inputs" {print $2}' <<<"$out")
[[ -f $tree && -f $inputs ]] || { echo "workloads.setup: workloads-inputs.py gave no inputs: $out" >&2; exit 1; }

# The guest works under SHARE/wl; nothing of an earlier run may be left there.
rm -rf "${S:?}/wl"
mkdir "$S/wl"

printf '%s\n' \
	-drive "file=$tree,format=raw,if=none,id=wltree,readonly=on" \
	-device "virtio-blk-pci,drive=wltree,serial=wl-tree" \
	-drive "file=$inputs,format=raw,if=none,id=wlinputs,readonly=on" \
	-device "virtio-blk-pci,drive=wlinputs,serial=wl-inputs" >"$VMTEST_VMM_ARGS_FILE"
{
	echo "tree $tree"
	echo "inputs $inputs"
	tar -xOf "$inputs" params
} >"$VMTEST_LOG_DIR/workloads-inputs.txt"
echo "workloads setup done: $(basename "$tree"), $(basename "$inputs")"
