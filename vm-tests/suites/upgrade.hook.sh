#!/usr/bin/env bash
# Host hook of the upgrade suite, run by run-vm.sh alongside the guest:
#   upgrade.hook.sh SHARED_DIR SERIAL_LOG
# On the guest's "VMTEST SYNC workload-running" (fio with verify, a metadata
# loop and a POSIX lock + flock on upg/locked, suites/upgrade.sh):
#  1. a host process (fsops lockwatch) tries the guest's locks every 5 ms until
#     the guest's checks are done: it must never get one;
#  2. VMTEST_UPGRADES (default 20) upgrades, alternating the binary under test
#     (volfsd.same) and the copy with another version string (volfsd.other, see
#     upgrade.setup.sh), each renamed over WORK/bin/volfsd first; by pairs
#     through `volfsd ctl upgrade` and SIGHUP to the keeper (the launched
#     process). Each must be reported done (ctl's "upgraded: the guest waited N
#     ms", the keeper's log line), the new serving process must run the version
#     installed, the old one must exit, and the guest's metadata loop must go on
#     (upg/meta/progress) before the next;
#  3. failing upgrades: a "binary" that exits 3 at once (ctl must fail saying
#     "exited with status 3"), one that refuses the state (volfsd on an empty
#     shared dir): each refused, the old serving process serves on and the guest
#     goes on; then a good upgrade still works;
#  4. the stop file. On "release-locks" it stops the lock watcher and answers.
# PASS/FAIL lines go to $VMTEST_LOG_DIR/upgrade-hook-results.log (upgrade.host.sh
# reports them); each upgrade's pause to $VMTEST_LOG_DIR/upgrade-pauses.txt
# ("N VERSION METHOD MS").
set -uo pipefail

S=${1:?usage: upgrade.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: upgrade.hook.sh SHARED_DIR SERIAL_LOG}
WORK=${VMTEST_WORK:?}
B=$WORK/bin
CTL=$WORK/ctl.sock
FSOPS=$WORK/fsops-host
KEEPER=${VMTEST_DAEMON_LAUNCHED_PID:?}
DLOG=$VMTEST_LOG_DIR/daemon.log
U=$S/upg
N=${VMTEST_UPGRADES:-20}
RESULTS=$VMTEST_LOG_DIR/upgrade-hook-results.log
PAUSES=$VMTEST_LOG_DIR/upgrade-pauses.txt
LOCKWATCH_LOG=$VMTEST_LOG_DIR/lockwatch.log
: >"$RESULTS"
: >"$PAUSES"
LW_PID=""
FAILS="" # hook-lib.sh's fail adds to it

HOOK_NAME=upgrade-hook
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"

ctl() { "$B/volfsd.same" ctl "$@" --control-socket "$CTL"; }

install_bin() { # install_bin KIND: WORK/bin/volfsd.KIND renamed over WORK/bin/volfsd
	cp "$B/volfsd.$1" "$B/.volfsd.new" && mv -f "$B/.volfsd.new" "$B/volfsd"
}

log_count() { grep -c "$1" "$DLOG" 2>/dev/null || true; }

# The serving process: the one the keeper's last "upgraded" line names, or at
# first the keeper's only child.
serving() {
	local p
	p=$(grep 'keeper: upgraded: serving process' "$DLOG" | tail -n 1 |
		sed -n 's/.*serving process \([0-9]*\) took over.*/\1/p')
	[[ -n $p ]] || p=$(awk '{print $1}' "/proc/$KEEPER/task/$KEEPER/children" 2>/dev/null)
	echo "$p"
}

progress() { cat "$U/meta/progress" 2>/dev/null || echo 0; }

# exe_of PID: the binary a serving process runs, as /proc/PID/exe. Under the
# namespace sandbox the pid the keeper started is the sandbox's supervisor, a tiny
# program volfsd executes from a memfd (docs/SECURITY.md): its child runs volfsd.
exe_of() {
	local p=$1
	if [[ $(readlink "/proc/$p/exe" 2>/dev/null) == /memfd:volfsd-supervisor* ]]; then
		p=$(awk '{print $1}' "/proc/$p/task/$p/children" 2>/dev/null)
	fi
	echo "/proc/${p:-0}/exe"
}

# guest_goes_on: the guest's metadata loop makes 2 more rounds within 60 s
guest_goes_on() {
	local n0 t0=$SECONDS
	n0=$(progress)
	until (($(progress) >= n0 + 2)); do
		((SECONDS - t0 < 60)) || { echo "the metadata loop stayed at round $(progress) for 60 s"; return 1; }
		sleep 0.1
	done
}

gone_within() { # gone_within PID SECS
	local i
	for i in $(seq $(($2 * 10))); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.1
	done
	! kill -0 "$1" 2>/dev/null
}

# wait_outcome OK_BEFORE FAILED_BEFORE: until the keeper logs one more upgrade
# or failed upgrade (60 s); prints "ok MS" or "failed WHY"
wait_outcome() {
	local t0=$SECONDS
	while ((SECONDS - t0 < 60)); do
		if (($(log_count 'keeper: upgraded:') > $1)); then
			echo "ok $(grep 'keeper: upgraded:' "$DLOG" | tail -n 1 | sed -n 's/.*the guest waited \([0-9]*\) ms.*/\1/p')"
			return
		fi
		if (($(log_count 'keeper: upgrade failed') > $2)); then
			echo "failed $(grep 'keeper: upgrade failed' "$DLOG" | tail -n 1)"
			return
		fi
		sleep 0.05
	done
	echo "failed: no outcome in the keeper's log within 60 s"
}

# upgrade_by METHOD: one upgrade by ctl or SIGHUP; prints "ok MS" or "failed WHY"
upgrade_by() {
	local ok0 failed0 out
	ok0=$(log_count 'keeper: upgraded:')
	failed0=$(log_count 'keeper: upgrade failed')
	case $1 in
	ctl)
		if out=$(ctl upgrade 2>&1); then
			if [[ $out =~ ^upgraded:\ the\ guest\ waited\ ([0-9]+)\ ms$ ]]; then
				echo "ok ${BASH_REMATCH[1]}"
			else
				echo "failed: ctl upgrade said '$out'"
			fi
			# The keeper logs it too.
			wait_outcome "$ok0" "$failed0" >/dev/null
		else
			echo "failed $out"
		fi
		;;
	sighup)
		kill -HUP "$KEEPER"
		wait_outcome "$ok0" "$failed0"
		;;
	esac
}

# one_upgrade I KIND METHOD: install KIND, upgrade, check
one_upgrade() {
	local i=$1 kind=$2 method=$3 name old new outcome want got
	name=$(printf 'upgrade-%02d-%s-by-%s' "$i" "$kind" "$method")
	old=$(serving)
	install_bin "$kind"
	outcome=$(upgrade_by "$method")
	if [[ $outcome != ok\ [0-9]* ]]; then
		fail "$name" "$outcome"
		return
	fi
	echo "$i $kind $method ${outcome#ok }" >>"$PAUSES"
	new=$(serving)
	want="volfsd $(cat "$B/version.$kind")"
	got=$("$(exe_of "$new")" --version 2>&1)
	if [[ $new == "$old" || -z $new ]]; then
		fail "$name" "the serving process is still $old"
	elif [[ $got != "$want" ]]; then
		fail "$name" "the new serving process $new runs '$got', want '$want'"
	elif ! gone_within "$old" 10; then
		fail "$name" "the old serving process $old still runs 10 s after the upgrade"
	elif ! why=$(guest_goes_on); then
		fail "$name" "$why"
	else
		pass "$name"
		info "$name: serving process $old -> $new ($got), the guest waited ${outcome#ok } ms"
	fi
}

# refused NAME KIND WANT: upgrading to KIND must fail (the reason matching WANT),
# the old serving process serve on and the guest go on
refused() {
	local name=$1 old out rc=0 why
	old=$(serving)
	install_bin "$2"
	out=$(ctl upgrade 2>&1) || rc=$?
	info "$name: ctl upgrade exited $rc: $out"
	if [[ $rc == 0 ]]; then
		fail "$name" "ctl upgrade succeeded: $out"
	elif ! grep -qE "$3" <<<"$out"; then
		fail "$name" "ctl upgrade's reason is not /$3/: $out"
	elif [[ $(serving) != "$old" ]] || ! kill -0 "$old" 2>/dev/null; then
		fail "$name" "the serving process $old did not serve on (now $(serving))"
	elif ! why=$(guest_goes_on); then
		fail "$name" "$why"
	else
		pass "$name"
	fi
}

upgrades() {
	local i kind method
	rm -f "$WORK/lockwatch.stop"
	"$FSOPS" lockwatch "$U/locked" "$WORK/lockwatch.stop" 5 >"$LOCKWATCH_LOG" 2>&1 &
	LW_PID=$!
	log "lock watcher $LW_PID on $U/locked"
	sleep 2
	for i in $(seq "$N"); do
		kind=same
		((i % 2 == 0)) || kind=other
		method=ctl
		(((i - 1) / 2 % 2 == 0)) || method=sighup
		one_upgrade "$i" "$kind" "$method"
		sleep 1
	done
	refused upgrade-refused-binary-exits exit3 'exited with status 3'
	refused upgrade-refused-state-refused refuse 'upgrade failed|refused|DEVICE_STATE'
	one_upgrade $((N + 1)) same ctl
	local pauses
	pauses=$(awk '{print $4}' "$PAUSES" | sort -n)
	if [[ -n $pauses ]]; then
		info "pauses (ms) over $(wc -l <<<"$pauses") upgrades: p50 $(awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}' <<<"$pauses") max $(tail -n 1 <<<"$pauses") min $(head -n 1 <<<"$pauses")"
	fi
	mkdir -p "$U"
	printf 'upgrades done\n' >"$U/.stop.tmp" && mv "$U/.stop.tmp" "$U/stop"
}

release_locks() {
	local summary
	if [[ -n $LW_PID ]]; then
		: >"$WORK/lockwatch.stop"
		wait "$LW_PID" || true
		LW_PID=""
		summary=$(tail -n 1 "$LOCKWATCH_LOG")
		if [[ $summary =~ ^attempts\ ([0-9]+)\ posix-granted\ 0\ flock-granted\ 0$ ]] && ((BASH_REMATCH[1] > 100)); then
			pass host-locks-held-throughout
			info "lock watcher: $summary"
		else
			fail host-locks-held-throughout "$summary; $(grep -m 3 granted "$LOCKWATCH_LOG" | tr '\n' ' ')"
		fi
	else
		fail host-locks-held-throughout "the lock watcher never ran"
	fi
	FAILS="" # the guest's answer is ok: the checks are reported here
	ack_in "$U" release-locks
}

step() {
	log "step: $1"
	case "$1" in
	workload-running) upgrades ;;
	release-locks) release_locks ;;
	*) log "unknown step '$1'" ;;
	esac
}

trap 'exit 0' TERM INT
follow_sync_steps
