#!/usr/bin/env bash
# Host setup of the crash suite, run by run-vm.sh before the boot:
#   crash.setup.sh SHARED_DIR
# volfsd (issue 26, docs/UPGRADE.md "A serving process that crashes"): runs with
# --upgradable, a control socket (the hook reads /metrics there) and the volume
# crash (SHARE/crash), and crash.hook.sh kills its serving process under the
# running guest again and again. virtiofsd (vm-tests/run-crash-compare.sh):
# given the same share; its guest sees SHARE/crash at the same path, and the hook
# kills it once and records what the guest sees.
set -euo pipefail

S=${1:?usage: crash.setup.sh SHARED_DIR}
W=${VMTEST_WORK:?}
mkdir -p "$S/crash"
if "${VMTEST_DAEMON:?}" --version 2>&1 | grep -q virtiofsd; then
	echo "crash setup: virtiofsd: it is killed once and the guest observed (observe mode)"
	exit 0
fi
"$VMTEST_DAEMON" --help 2>&1 | grep -q -- --upgradable || { echo "$VMTEST_DAEMON has no --upgradable"; exit 1; }
{
	echo --upgradable
	echo "--control-socket=$W/ctl.sock"
	echo "--allowed-dir=crash"
} >>"${VMTEST_DAEMON_ARGS_FILE:?}"
echo "crash setup done: share $S"
