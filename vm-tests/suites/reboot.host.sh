#!/usr/bin/env bash
# Host side of the reboot suite, run by run-vm.sh after the VM exited:
#   reboot.host.sh SHARED_DIR
# Reports the checks reboot.hook.sh made during the two boots, then checks
# that both boots ran their part and left the expected files.
set -uo pipefail

S=${1:?usage: reboot.host.sh SHARED_DIR}
RESULTS=$VMTEST_LOG_DIR/reboot-hook-results.log
R=$S/reboot

if [[ -s $RESULTS ]]; then
	cat "$RESULTS"
else
	echo "VMTEST FAIL host-hook-results: reboot.hook.sh left no results in $RESULTS"
fi
for name in host-posix-lock-held-boot1 host-flock-held-boot1 \
	host-posix-lock-free-after-reboot host-flock-free-after-reboot; do
	grep -qE "^VMTEST (PASS|FAIL) $name(:|$)" "$RESULTS" 2>/dev/null ||
		echo "VMTEST FAIL $name: the hook never ran this check"
done

boots=$(tr -d '\r' <"$VMTEST_SERIAL" | grep -c '^VMTEST INIT')
echo "VMTEST INFO the guest reached /init $boots time(s) in one VM"
phase=$(cat "$R/phase" 2>/dev/null)
if [[ $phase == 2 && $boots -ge 2 ]]; then
	echo "VMTEST PASS host-both-boots-ran"
else
	echo "VMTEST FAIL host-both-boots-ran: phase marker '$phase' (want 2), $boots boot(s) reached /init (want 2)"
fi
want=$'written in boot 1\nappended in boot 2'
if [[ $(cat "$R/locked-file" 2>&1) == "$want" ]]; then
	echo "VMTEST PASS host-file-contents"
else
	echo "VMTEST FAIL host-file-contents: $(tr '\n' '|' <"$R/locked-file" 2>&1)"
fi
if grep -qiE 'panick|panic' "$VMTEST_LOG_DIR/daemon.log"; then
	echo "VMTEST FAIL host-daemon-no-panic: $(grep -iE 'panic' "$VMTEST_LOG_DIR/daemon.log" | head -n 2 | tr '\n' ' ')"
else
	echo "VMTEST PASS host-daemon-no-panic"
fi
