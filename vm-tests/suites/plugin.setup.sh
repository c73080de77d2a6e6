#!/usr/bin/env bash
# Host setup of the plugin suite (run by vm-tests/run-plugin.sh through
# run-vm.sh): the daemon starts with a control socket and no volume; the node
# agent (plugin.hook.sh) attaches the JuiceFS volume at runtime.
set -euo pipefail
S=${1:?usage: plugin.setup.sh SHARED_DIR}
[[ -n ${PLUGIN_BIN:-} ]] || { echo "run the plugin suite through vm-tests/run-plugin.sh"; exit 1; }
[[ -z $(ls -A "$S") ]] || { echo "SharedDir $S is not empty"; exit 1; }
printf '%s\n' --control-socket "$VMTEST_WORK/ctl.sock" >"$VMTEST_DAEMON_ARGS_FILE"
