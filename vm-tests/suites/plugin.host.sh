#!/usr/bin/env bash
# Host side of the plugin suite, after the VM exited: plugin.host.sh SHARED_DIR
# Reports the node agent's checks (plugin.hook.sh); run-plugin.sh then checks
# the data kept after the detach and the destroy.
set -uo pipefail
RESULTS=${VMTEST_LOG_DIR:?}/plugin-hook-results.log
if [[ -s $RESULTS ]]; then
	cat "$RESULTS"
else
	echo "VMTEST FAIL host-hook-results: plugin.hook.sh left no results in $RESULTS"
fi
for name in host-plugin-attach-before-failed-create host-create-fails-after-attach host-plugin-rollback-detach \
	host-rollback-leaves-nothing host-plugin-attach-sb-1 host-hostpath-inside-base host-hostpath-is-juicefs \
	host-ctl-attach-vol host-plugin-attach-sb-2-refcount-1 host-second-sandbox-same-hostpath host-no-second-mount \
	host-plugin-detach-sb-2-refcount-1 host-refcount-1-detach-keeps-mount host-ctl-detach-vol \
	host-plugin-detach-unmounts host-juicefs-unmounted-after-detach; do
	grep -qE "^VMTEST (PASS|FAIL) $name(:|$)" "$RESULTS" 2>/dev/null ||
		echo "VMTEST FAIL $name: the hook never ran this check"
done
