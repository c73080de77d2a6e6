#!/usr/bin/env bash
# Host setup of the control suite, run by run-vm.sh before the first boot:
#   control.setup.sh SHARED_DIR
# The daemon starts with a control socket and no --allowed-dir (the guest's
# root is empty); control.hook.sh attaches and detaches volumes from the
# host directories made here (outside SharedDir) as the guest asks.
set -euo pipefail

S=${1:?usage: control.setup.sh SHARED_DIR}
W=${VMTEST_WORK:?}

[[ -z $(ls -A "$S") ]] || { echo "SharedDir $S is not empty"; exit 1; }
rm -rf "$W/vol-data" "$W/vol-models"
mkdir -p "$W/vol-data" "$W/vol-models/sub"
printf 'data-v1\n' >"$W/vol-data/hello.txt"
printf 'model-v1\n' >"$W/vol-models/model.bin"
printf 'nested model\n' >"$W/vol-models/sub/nested.txt"

printf '%s\n' --control-socket "$W/ctl.sock" >"$VMTEST_DAEMON_ARGS_FILE"
echo "control setup done: data=$W/vol-data models=$W/vol-models socket=$W/ctl.sock"
