#!/usr/bin/env bash
# Host setup of the reboot suite, run by run-vm.sh before the first boot:
#   reboot.setup.sh SHARED_DIR
# The suite needs a VM that may reboot (run-vm.sh --allow-reboot). Builds the
# fsops helper for the host ($VMTEST_WORK/fsops-host): reboot.hook.sh uses its
# `trylock` to see from the host whether the guest's locks are held.
set -euo pipefail

S=${1:?usage: reboot.setup.sh SHARED_DIR}
W=${VMTEST_WORK:?}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[[ ${VMTEST_ALLOW_REBOOT:-0} == 1 ]] || {
	echo "the reboot suite needs a VM that may reboot: run-vm.sh --suite reboot --allow-reboot"
	exit 1
}
# The guest tells its first boot from the second by a marker in SHARE/reboot.
[[ ! -e $S/reboot ]] || { echo "$S/reboot exists already (left from an earlier run?)"; exit 1; }
gcc -O2 -Wall -o "$W/fsops-host" "$HERE/../guest/fsops.c"
echo "reboot setup done: $W/fsops-host"
