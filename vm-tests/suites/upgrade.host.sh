#!/usr/bin/env bash
# Host side of the upgrade suite, run by run-vm.sh after the VM exited:
#   upgrade.host.sh SHARED_DIR
# Reports the checks upgrade.hook.sh made while the guest ran, checks that every
# one of them ran, that the keeper logged each upgrade (and each refused one),
# that no daemon process panicked, and prints the pauses (p50, max).
set -uo pipefail

S=${1:?usage: upgrade.host.sh SHARED_DIR}
RESULTS=$VMTEST_LOG_DIR/upgrade-hook-results.log
PAUSES=$VMTEST_LOG_DIR/upgrade-pauses.txt
DLOG=$VMTEST_LOG_DIR/daemon.log
N=${VMTEST_UPGRADES:-20}

if [[ -s $RESULTS ]]; then
	cat "$RESULTS"
else
	echo "VMTEST FAIL host-hook-results: upgrade.hook.sh left no results in $RESULTS"
fi
for name in host-locks-held-throughout upgrade-refused-binary-exits upgrade-refused-state-refused; do
	grep -qE "^VMTEST (PASS|FAIL) $name(:|$)" "$RESULTS" 2>/dev/null ||
		echo "VMTEST FAIL $name: the hook never ran this check"
done
ran=$(grep -cE '^VMTEST (PASS|FAIL) upgrade-[0-9]+-' "$RESULTS" 2>/dev/null || true)
if [[ $ran == $((N + 1)) ]]; then
	echo "VMTEST PASS host-all-upgrades-ran"
else
	echo "VMTEST FAIL host-all-upgrades-ran: $ran upgrade checks, want $((N + 1))"
fi

ok=$(grep -c 'keeper: upgraded:' "$DLOG" || true)
failed=$(grep -c 'keeper: upgrade failed' "$DLOG" || true)
if [[ $ok == $((N + 1)) && $failed == 2 ]]; then
	echo "VMTEST PASS host-keeper-logged-every-upgrade"
else
	echo "VMTEST FAIL host-keeper-logged-every-upgrade: $ok upgrades (want $((N + 1))) and $failed failed ones (want 2) in $DLOG"
fi
grep 'keeper: upgrade failed' "$DLOG" | sed 's/^/VMTEST INFO /' | cut -c1-400
# Nodes the guest held whose files were unlinked (the metadata loop's, before the
# guest's FORGET): lost in the load (--migration-on-error=guest-error, see
# upgrade.setup.sh), which the guest's checks show it never used.
lost=$(sed -n 's/.*device state loaded.* lost \([0-9]*\) nodes.*/\1/p' "$DLOG" | awk '{s += $1; if ($1 > 0) n++} END {printf "%d nodes in %d loads", s, n}')
echo "VMTEST INFO nodes the guest held unlinked, lost in the upgrades' loads: $lost"
if grep -qiE 'panick|panic' "$DLOG"; then
	echo "VMTEST FAIL host-daemon-no-panic: $(grep -iE 'panic' "$DLOG" | head -n 2 | tr '\n' ' ')"
else
	echo "VMTEST PASS host-daemon-no-panic"
fi
if [[ $(cat "$S/upg/after-upgrades" 2>/dev/null) == "upgrades done" ]]; then
	echo "VMTEST PASS host-sees-the-guests-last-write"
else
	echo "VMTEST FAIL host-sees-the-guests-last-write: upg/after-upgrades is '$(cat "$S/upg/after-upgrades" 2>&1)'"
fi
if [[ -s $PAUSES ]]; then
	sort -n -k4 "$PAUSES" | awk '{a[NR] = $4} END {
		printf "VMTEST INFO upgrade pauses (ms, the keeper'"'"'s measure) over %d upgrades: min %d p50 %d max %d\n", NR, a[1], a[int((NR + 1) / 2)], a[NR] }'
	echo "VMTEST INFO pauses in order: $(awk '{printf "%s ", $4}' "$PAUSES")"
fi
