#!/usr/bin/env bash
# Host side of the control suite, run by run-vm.sh after the VM exited:
#   control.host.sh SHARED_DIR
# Reports the checks control.hook.sh made while the guest ran, then checks
# that nothing is left mounted and the data volume holds the guest's writes.
# (run-vm.sh itself checks that the daemon exited 0: daemon-exit.)
set -uo pipefail

S=${1:?usage: control.host.sh SHARED_DIR}
W=${VMTEST_WORK:?VMTEST_WORK not set (run through run-vm.sh)}
RESULTS=$VMTEST_LOG_DIR/control-hook-results.log

if [[ -s $RESULTS ]]; then
	cat "$RESULTS"
else
	echo "VMTEST FAIL host-hook-results: control.hook.sh left no results in $RESULTS"
fi
# Every step the guest asked for must have reported.
for name in host-ctl-attach-data host-sees-guest-write host-ctl-attach-models host-stats-data-moved \
	host-stats-models-ro host-ctl-detach-data-while-open host-detach-unmounted host-daemon-released-data-fds \
	host-bind-umount-cycle-after-detach host-list-after-detach host-ctl-reattach-data host-stats-data-after-reattach \
	host-sees-write-after-reattach host-ctl-detach-data-final host-ctl-detach-models-final host-no-mounts-after-detach; do
	grep -qE "^VMTEST (PASS|FAIL) $name(:|$)" "$RESULTS" 2>/dev/null ||
		echo "VMTEST FAIL $name: the hook never ran this check"
done

# SharedDir's own shared mount (made by run-vm.sh, as a platform makes it) stays.
left=$(awk -v s="$S" -v w="$W" '$5 != s && (index($5, s "/") == 1 || index($5, w "/") == 1) {print $5}' /proc/self/mountinfo)
if [[ -z $left ]]; then
	echo "VMTEST PASS host-no-mounts-left"
else
	echo "VMTEST FAIL host-no-mounts-left: $(echo "$left" | tr '\n' ' ')"
fi
if [[ -z $(ls -A "$S") ]]; then
	echo "VMTEST PASS host-shared-dir-empty"
else
	echo "VMTEST FAIL host-shared-dir-empty: $(ls -A "$S" | tr '\n' ' ')"
fi
got=$(cd "$W/vol-data" && ls | tr '\n' ' ')
if [[ $got == "guest-wrote-2.txt hello.txt v2.txt " && $(cat "$W/vol-data/guest-wrote-2.txt") == "after reattach" ]]; then
	echo "VMTEST PASS host-data-contents"
else
	echo "VMTEST FAIL host-data-contents: $got"
fi
if grep -qiE 'panick|panic' "$VMTEST_LOG_DIR/daemon.log"; then
	echo "VMTEST FAIL host-daemon-no-panic: $(grep -iE 'panic' "$VMTEST_LOG_DIR/daemon.log" | head -n 2 | tr '\n' ' ')"
else
	echo "VMTEST PASS host-daemon-no-panic"
fi
echo "VMTEST INFO daemon log warnings/errors: $(grep -cE ' (WARN|ERROR) ' "$VMTEST_LOG_DIR/daemon.log")"
