#!/usr/bin/env bash
# cloud-hypervisor moves a guest while it works (issue 34): snapshot and restore,
# the same snapshot restored into two clones at once, live migration (local and
# over TCP, there and back), and cloud-hypervisor's reconnect to a daemon
# restarted whole. The counterpart of run-migration.sh (QEMU), with the same
# guest workload (suites/migration.sh): an fd open for appending (a numbered line
# every 100 ms), one for reading, a directory in the middle of its readdir, its
# cwd, a POSIX lock and an flock, a shared map and fio with verify, in the volume
# data (--allowed-dir data). The guest never learns when it moves; after the host
# writes the stop file it checks them all. Meanwhile a host process (fsops
# lockwatch) tries the guest's locks every 5 ms and must never get one.
#
# Usage: vm-tests/run-ch-migration.sh --mode snapshot|live|reconnect [options]
#   --daemon PATH          daemon binary (default target/release/volfsd); virtiofsd
#                          is run with the options it knows (no volumes, no
#                          control socket: the guest's work is in SHARE/data all
#                          the same)
#   --daemon-args "..."    extra arguments of every daemon (word-split)
#   --no-host-locks        do not try the guest's locks from the host (virtiofsd
#                          keeps them in the guest's kernel)
#   --mem SIZE             guest RAM (default 512M)
#   --log-dir DIR          logs (default build/vm-logs/ch-migration-MODE)
#   --boot-attempts N      a boot that never reaches /init is retried (default 3)
#   --require              fail (instead of skipping) without cloud-hypervisor
#   --ch-version V         the cloud-hypervisor to build when none is given
#                          (v53.0 or main; ch-lib.sh)
#   --keep                 keep the temp dir
#
# Modes (one guest boot each; checks are named after the VM that ran them):
#   snapshot   the guest also holds a file of a read-only volume with a rate limit
#              (ops_size=10 per second), attached through the control socket
#              while it runs (rolim). ch-remote pause and snapshot of src; a fresh
#              volfsd (rolim attached read-only, without a limit: the limit must
#              come with the state) and cloud-hypervisor --restore, then resume:
#              VM "restored", on the share itself, while src stays paused until
#              restored runs (the same-host lock hand-over: the lock watcher runs
#              from before the pause to the end); then src is shut down and its
#              daemon must exit 0. Then the same snapshot restored twice at once
#              (clone1, clone2) into two copies of the share made at the snapshot,
#              each with its own daemon and socket (the snapshot's config.json
#              rewritten): each clone's writes land in its copy only, the share
#              is left alone.
#   live       live migrations of one guest, each to a new cloud-hypervisor
#              (ch-remote receive-migration): a1 -> b1 over TCP on 127.0.0.1
#              (memory copied, dirty pages logged by the daemon too; b1 on a new
#              daemon on the same socket path, the source daemon hands the
#              guest's lock files over and is then stopped: SIGTERM, exit 0),
#              b1 -> a2 -> b2 with local=on (memory handed over as fds; the
#              destination on the source's daemon, --keep-serving, twice). No
#              TCP migration back: cloud-hypervisor refuses it for a VM that came
#              in by a migration, and its guest then dies (see mode_live).
#   reconnect  volfsd --upgradable: VMTEST_RECONNECTS (default 3) times, the
#              whole daemon (keeper, supervisor, serving process) SIGKILLed and
#              started again with the same command line while the guest appends;
#              cloud-hypervisor reconnects (SET_INFLIGHT_FD with the region it
#              kept), the new keeper takes the guest's session back from it, and
#              the guest carries on. No host lock watcher here: a daemon killed
#              whole lets go of the lock files (the new one takes the locks again
#              from the region); the guest checks its locks itself.
#
# Logs per VM NAME in LOG_DIR: serial-NAME.log (its console: cloud-hypervisor's
# standard output), ch-NAME.log, daemon-NAME.log, lockwatch-*.log; timings.txt
# (snapshot, restore, migration and reconnect times). Ends with "N passed, N
# failed"; exit status 0 only if nothing failed. Without hardware KVM it runs
# itself in an L1 guest (ch-lib.sh), as run-vm.sh does.
set -eEuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=runner-lib.sh
. "$HERE/runner-lib.sh"
# shellcheck source=ch-lib.sh
. "$HERE/ch-lib.sh"

ORIG_ARGS=("$@")
MODE=""
DAEMON="$REPO/target/release/volfsd"
DAEMON_ARGS=""
HOST_LOCKS=1
MEM=512M
LOG_DIR=""
BOOT_ATTEMPTS=3
BOOT_TIMEOUT=240 # seconds from cloud-hypervisor's start to the guest's VMTEST INIT (nested)
REQUIRE=0
KEEP=0
PRE=3  # seconds the guest works before a move
POST=3 # ... and after it, before the host writes the stop file
RECONNECTS=${VMTEST_RECONNECTS:-3}
KEEP_SERVING=() # the live mode's first daemon gets --keep-serving

WORK=""
declare -A DPID=() VPID=() LWPID=() SERIAL=()
PASSED=0
FAILED=0
T_START=$(date +%s.%N)

say() { printf 'run-ch-migration: [%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $T_START" | bc)" "$*"; }
die() {
	echo "run-ch-migration: error: $*" >&2
	exit 2
}
usage() {
	sed -n '2,/^set -eEuo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
	exit "${1:-0}"
}

while [[ $# -gt 0 ]]; do
	case "$1" in
	--mode) MODE=${2:?}; shift ;;
	--daemon) DAEMON=${2:?}; shift ;;
	--daemon-args) DAEMON_ARGS=${2?}; shift ;;
	--no-host-locks) HOST_LOCKS=0 ;;
	--mem) MEM=${2:?}; shift ;;
	--log-dir) LOG_DIR=${2:?}; shift ;;
	--boot-attempts) BOOT_ATTEMPTS=${2:?}; shift ;;
	--require) REQUIRE=1 ;;
	--ch-version) CH_VERSION=${2:?}; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) usage 0 ;;
	*) echo "run-ch-migration: unknown option: $1" >&2; usage 2 ;;
	esac
	shift
done
case $MODE in snapshot | live | reconnect) ;; *) die "--mode must be snapshot, live or reconnect" ;; esac
[[ -x $DAEMON ]] || die "daemon '$DAEMON' is not an executable (cargo build --release, or pass --daemon)"
DAEMON=$(readlink -f "$DAEMON")
[[ $EUID == 0 ]] || die "needs root (volfsd's sandbox, cloud-hypervisor's /dev/kvm)"
MEM=${MEM^^}
case $MEM in *G) MEM=$((${MEM%G} * 1024)) ;; *M) MEM=${MEM%M} ;; esac
[[ $MEM =~ ^[0-9]+$ ]] || die "bad --mem"
LOG_DIR=$(realpath -m "${LOG_DIR:-$REPO/build/vm-logs/ch-migration-$MODE}")
VIRTIOFSD=0
"$DAEMON" --version 2>&1 | grep -q virtiofsd && VIRTIOFSD=1
if [[ $MODE == reconnect && $VIRTIOFSD == 0 ]] && ! "$DAEMON" --help 2>&1 | grep -q -- --upgradable; then
	die "the reconnect mode needs volfsd's --upgradable ($DAEMON has none)"
fi

# ---------------------------------------------------------------- processes

FINISHED=0
cleanup() {
	local p
	l1_stop
	if [[ $FINISHED == 0 && -n $MODE && -n $WORK ]]; then
		fail runner "run-ch-migration.sh stopped before the end of the $MODE mode (see above)"
		echo "$PASSED passed, $FAILED failed"
	fi
	for p in "${VPID[@]}" "${LWPID[@]}" "${DPID[@]}"; do stop_pid "$p" 2; done
	if [[ -n $WORK ]]; then
		if [[ $KEEP == 1 ]]; then say "kept $WORK"; else rm -rf "$WORK"; fi
	fi
}

cache_mode() { # the daemon's word for "no caching" (volfsd: none, virtiofsd: never)
	if [[ $VIRTIOFSD == 1 ]]; then echo never; else echo none; fi
}

# The daemon's arguments for a VM on SHARE: the volume data on the command line;
# volfsd also gets a control socket (the runtime volume, the checks of its limit).
daemon_args() { # daemon_args NAME
	if [[ $VIRTIOFSD == 1 ]]; then
		# virtiofsd needs --allow-mmap for the shared map with --cache=never.
		echo --allow-mmap
	else
		echo --allowed-dir=data
		echo "--control-socket=$WORK/ctl-$1.sock"
	fi
}

# start_daemon NAME SHARE SOCKET [ARGS...]: daemon NAME serving SHARE on SOCKET
start_daemon() {
	local name=$1 share=$2 sock=$3 args
	shift 3
	mapfile -t args < <(daemon_args "$name")
	# Another daemon may still listen there (a restore or a migration to the
	# same socket path while the source runs): its file goes first, so the
	# socket found below is the new daemon's. The old one keeps serving the
	# connection it has.
	rm -f "$sock"
	# shellcheck disable=SC2086 # --daemon-args is word-split by design
	"$DAEMON" --socket-path="$sock" --shared-dir="$share" --cache="$(cache_mode)" "${args[@]}" $DAEMON_ARGS "$@" \
		>>"$LOG_DIR/daemon-$name.log" 2>&1 &
	DPID[$name]=$!
	local i
	for i in $(seq 100); do
		[[ -S $sock ]] && break
		kill -0 "${DPID[$name]}" 2>/dev/null || break
		sleep 0.1
	done
	if ! kill -0 "${DPID[$name]}" 2>/dev/null; then
		show_tail "$LOG_DIR/daemon-$name.log" "daemon $name log"
		die "daemon $name exited at its start"
	fi
	say "daemon $name (pid ${DPID[$name]}) on $share, socket $sock${*:+: $*}"
}

ctl() { # ctl NAME ARGS...: volfsd ctl on daemon NAME's control socket
	local name=$1
	shift
	"$DAEMON" ctl "$@" --control-socket "$WORK/ctl-$name.sock"
}

# The kernel command line of every VM (a restore or a migration keeps the
# source's): the guest workload's mode.
GUEST_MODE=chdata
cmdline() { echo "console=ttyS0 panic=-1 quiet vmtest.suite=migration vmtest.migration=$GUEST_MODE${BREAK:-}"; }

# ch NAME ARGS...: cloud-hypervisor NAME (its API socket WORK/api-NAME.sock, its
# console serial-NAME.log from its standard output, its log ch-NAME.log)
ch() {
	local name=$1
	shift
	SERIAL[$name]=$LOG_DIR/serial-$name.log
	: >"${SERIAL[$name]}"
	echo "cloud-hypervisor $CH_VERSION_TEXT: $*" >"$LOG_DIR/ch-$name.log"
	"$CH_BIN" -v --log-file "$LOG_DIR/ch-$name.log" --api-socket "path=$WORK/api-$name.sock" \
		"$@" </dev/null >>"${SERIAL[$name]}" 2>>"$LOG_DIR/ch-$name.log" &
	VPID[$name]=$!
	for _ in $(seq 100); do
		[[ -S $WORK/api-$name.sock ]] && break
		kill -0 "${VPID[$name]}" 2>/dev/null || break
		sleep 0.1
	done
}

chr() { # chr NAME ARGS...: ch-remote on VMM NAME
	local name=$1
	shift
	timeout 300 "$CH_REMOTE" --api-socket "$WORK/api-$name.sock" "$@"
}

vm_state() { chr "$1" info 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null || echo unknown; }

# wait_state NAME STATE SECS
wait_state() {
	local t0=$SECONDS st
	while :; do
		st=$(vm_state "$1")
		[[ $st == "$2" ]] && return 0
		((SECONDS - t0 < $3)) || { say "VMM $1: state '$st' after $3 s, not $2"; return 1; }
		kill -0 "${VPID[$1]}" 2>/dev/null || { say "VMM $1 exited (state $st)"; return 1; }
		sleep 0.2
	done
}

# The VMs' seccomp: v53.0's own filter kills its migration-worker thread (see
# docs/MIGRATION.md); the live mode runs the VMMs with --seccomp log.
SECCOMP=(--seccomp true)

# The console's complete lines (a line is written in pieces).
serial_lines() {
	local text
	text=$(tr -d '\r\0' <"${SERIAL[$1]}" 2>/dev/null; echo .)
	text=${text%.}
	case "$text" in *$'\n') ;; *$'\n'*) text=${text%$'\n'*}$'\n' ;; *) text="" ;; esac
	printf '%s' "$text"
}

# wait_serial NAME REGEX SECS: until a line of NAME's console matches; 1 on a
# timeout, when VMM NAME exits first or when it reset its guest (vm_reset)
wait_serial() {
	local t0=$SECONDS
	until serial_lines "$1" | grep -qaE "$2"; do
		((SECONDS - t0 < $3)) || return 1
		! vm_reset "$1" >/dev/null || return 1
		kill -0 "${VPID[$1]}" 2>/dev/null || { serial_lines "$1" | grep -qaE "$2"; return; }
		sleep 0.2
	done
}

gone_within() { # gone_within PID SECS
	for _ in $(seq $(($2 * 10))); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.1
	done
	! kill -0 "$1" 2>/dev/null
}

# daemon_exit NAME CHECK: daemon NAME, whose VMM is gone, must exit 0
daemon_exit() {
	local pid=${DPID[$1]} status=0
	if ! gone_within "$pid" 20; then
		fail "$2" "daemon $1 still runs 20 s after its VMM went away"
		stop_pid "$pid"
		return
	fi
	wait "$pid" || status=$?
	unset "DPID[$1]"
	if [[ $status == 0 ]]; then
		pass "$2"
	else
		fail "$2" "daemon $1 exited with status $status ($(grep -aiE 'error|panic' "$LOG_DIR/daemon-$1.log" | tail -n 2 | tr '\n' ' '))"
	fi
}

vmm_gone() { # vmm_gone NAME: wait for VMM NAME to end (shut it down after 20 s)
	if ! gone_within "${VPID[$1]}" 20; then
		chr "$1" shutdown-vmm >/dev/null 2>&1 || true
		gone_within "${VPID[$1]}" 10 || stop_pid "${VPID[$1]}"
	fi
	wait "${VPID[$1]}" 2>/dev/null || true
	unset "VPID[$1]"
}

timing() { echo "$*" >>"$LOG_DIR/timings.txt"; say "timing: $*"; }
elapsed() { echo "$(date +%s.%N) - $1" | bc | awk '{printf "%.2f", $1}'; }

# ---------------------------------------------------------------- results

# collect NAME: the guest's results in NAME's console, named NAME/CHECK
collect() {
	local line
	while IFS= read -r line; do
		case "$line" in
		"VMTEST PASS "*) pass "$1/${line#VMTEST PASS }" ;;
		"VMTEST FAIL "*) result_line "VMTEST FAIL $1/${line#VMTEST FAIL }" ;;
		"VMTEST INFO "*) echo "  [$1] ${line#VMTEST }" ;;
		esac
	done < <(serial_lines "$1" | grep -a '^VMTEST ' | grep -v '^VMTEST INFO time ')
}

# ---------------------------------------------------------------- host's view

FSOPS_HOST=""
lines_of() { [[ -f $1/append.log ]] && wc -l <"$1/append.log" || echo 0; }

watch_locks() { # watch_locks NAME FILE: a host process tries FILE's locks until unwatch_locks
	[[ $HOST_LOCKS == 1 ]] || return 0
	rm -f "$WORK/lockwatch-$1.stop"
	"$FSOPS_HOST" lockwatch "$2" "$WORK/lockwatch-$1.stop" 5 >"$LOG_DIR/lockwatch-$1.log" 2>&1 &
	LWPID[$1]=$!
	say "host tries the locks on $2 every 5 ms (lockwatch-$1.log)"
}

unwatch_locks() { # unwatch_locks NAME WHAT: it must never have got a lock
	[[ $HOST_LOCKS == 1 && -n ${LWPID[$1]:-} ]] || return 0
	local summary
	: >"$WORK/lockwatch-$1.stop"
	wait "${LWPID[$1]}" || true
	unset "LWPID[$1]"
	summary=$(tail -n 1 "$LOG_DIR/lockwatch-$1.log")
	if [[ $summary =~ ^attempts\ ([0-9]+)\ posix-granted\ 0\ flock-granted\ 0$ ]] && ((BASH_REMATCH[1] > 10)); then
		pass "$1/host-locks-held"
		say "lock watcher $1: $summary ($2)"
	else
		fail "$1/host-locks-held" "$2: $summary; $(grep -m 3 granted "$LOG_DIR/lockwatch-$1.log" | tr '\n' ' ')"
	fi
}

# vm_reset NAME: cloud-hypervisor NAME reset its guest (a triple fault, a reboot:
# it has no -no-reboot); prints why
vm_reset() { grep -aE 'triple-fault|VM reset event' "$LOG_DIR/ch-$1.log" 2>/dev/null | head -n 2 | sed 's/^.*-- //' | tr '\n' ' ' | grep .; }

guest_goes_on() { # guest_goes_on NAME DIR: the appender, seen on the host, goes on
	local n0 t0=$SECONDS
	n0=$(lines_of "$2")
	until (($(lines_of "$2") >= n0 + 5)); do
		if ((SECONDS - t0 > 60)); then
			fail "$1/guest-goes-on" "append.log stayed at $(lines_of "$2") lines for 60 s (from $n0)"
			return 1
		fi
		sleep 0.2
	done
	pass "$1/guest-goes-on"
}

ack() { # ack DIR STEP
	mkdir -p "$1/.acks"
	printf 'ok\n' >"$1/.acks/.$2.tmp" && mv "$1/.acks/.$2.tmp" "$1/.acks/$2"
}

stop_guest() { printf '%s\n' "$2" >"$1/.stop.tmp" && mv "$1/.stop.tmp" "$1/stop"; }

# finish_guest NAME DIR [WATCHER]: after stop_guest: the guest checks, the host
# stops trying its locks, the guest lets them go and powers off; its daemon
# (DAEMON_OF[NAME], default NAME) exits 0
declare -A DAEMON_OF=() KS=()
finish_guest() {
	local name=$1 dir=$2 watcher=${3:-$1} why d=${DAEMON_OF[$1]:-$1}
	if wait_serial "$name" '^VMTEST SYNC release-locks$' 300; then
		unwatch_locks "$watcher" "from before the move until the guest's checks ended"
		[[ $GUEST_MODE != chro ]] || rolim_after "$name"
		ack "$dir" release-locks
	elif why=$(vm_reset "$name"); then
		# Its console now shows a new boot: nothing of it counts.
		fail "$name/guest-reset" "cloud-hypervisor reset the guest: $why"
		unwatch_locks "$watcher" "until the guest was reset"
		stop_pid "${VPID[$name]}"
		unset "VPID[$name]"
		[[ -z ${DPID[$d]:-} ]] || { stop_pid "${DPID[$d]}"; unset "DPID[$d]"; }
		return 0
	else
		unwatch_locks "$watcher" "(the guest never asked to release them)"
		fail "$name/release-locks" "the guest never got to its release-locks step"
	fi
	if wait_serial "$name" '^VMTEST DONE$' 180 && gone_within "${VPID[$name]}" 30; then
		say "guest $name powered off"
	else
		fail "$name/guest-done" "no VMTEST DONE and power-off within 210 s$(why=$(vm_reset "$name") && echo ": reset: $why")"
		show_tail "${SERIAL[$name]}" "console of $name"
		stop_pid "${VPID[$name]}"
	fi
	wait "${VPID[$name]}" 2>/dev/null || true
	unset "VPID[$name]"
	collect "$name"
	if [[ -n ${KS[$d]:-} ]]; then
		# --keep-serving waits for the next frontend: stopped as a launcher would.
		kill -TERM "${DPID[$d]}" 2>/dev/null || true
		daemon_exit "$d" "$name/daemon-exit-0-after-sigterm"
	else
		daemon_exit "$d" "$name/daemon-exit-0"
	fi
}

# host_checks NAME DIR WHO: what the guest left in DIR: every appended line
# exactly once, then "end WHO"; the shared map's writes
host_checks() {
	local name=$1 dir=$2 who=$3 n before after
	n=$(grep -c '^[0-9]*$' "$dir/append.log" || true)
	if awk -v n="$n" 'NR <= n && $1 != NR {exit 1} END {exit NR != n + 1}' "$dir/append.log" &&
		[[ $(tail -n 1 "$dir/append.log") == "end $who" ]]; then
		pass "$name/host-append-lines-exactly-once"
		say "$name: the host has append.log lines 1..$n and 'end $who'"
	else
		fail "$name/host-append-lines-exactly-once" "append.log is not 1..N then 'end $who': $(awk '$1 != NR {print NR ": " $0; exit}' "$dir/append.log"), last: $(tail -n 1 "$dir/append.log")"
	fi
	before=$(dd if="$dir/mapped" bs=1 count=11 2>/dev/null)
	after=$(dd if="$dir/mapped" bs=1 skip=128 count=10 2>/dev/null)
	if [[ $before == before-move && $after == after-move ]]; then
		pass "$name/host-map-writes-landed"
	else
		fail "$name/host-map-writes-landed" "the host's mapped file reads '$before' at 0 and '$after' at 128"
	fi
}

finish_on() { # finish_on NAME DIR WHO [WATCHER]
	stop_guest "$2" "$3"
	finish_guest "$1" "$2" "${4:-$1}"
	host_checks "$1" "$2" "$3"
}

# ---------------------------------------------------------------- the runtime volume

# 10 operations a second: the guest's reader (20 reads a second) is throttled.
ROLIM_LIMIT=(--limit ops_size=10 --limit ops_refill_time_ms=1000)

# rolim_attach NAME [--limit ...]: the read-only volume rolim attached to daemon NAME
rolim_attach() {
	local name=$1 out
	shift
	if out=$(ctl "$name" attach rolim --read-only "$@" 2>&1); then
		pass "$name/host-attach-rolim${1:+-with-limit}"
	else
		fail "$name/host-attach-rolim${1:+-with-limit}" "$out"
	fi
}

# rolim_is NAME CHECK PATTERN: daemon NAME's view of rolim
rolim_is() {
	local js
	js=$(ctl "$1" --json stats rolim 2>&1)
	if [[ $js == *$3* ]]; then pass "$1/$2"; else fail "$1/$2" "rolim: $js (want $3)"; fi
}

# At the guest's release-locks step: rolim is still read-only and limited, and
# its limit throttled the guest's stats.
rolim_after() {
	local name=${DAEMON_OF[$1]:-$1} metrics throttled
	rolim_is "$name" host-rolim-read-only-and-limited '"read_only":true'
	rolim_is "$name" host-rolim-limit-held '"rate_limiter":{"ops":{"size":10,'
	metrics=$(ctl "$name" metrics 2>&1)
	throttled=$(grep -F 'volfsd_qos_throttled_requests_total{volume="rolim"}' <<<"$metrics" | awk '{print $2}')
	if awk -v n="${throttled:-0}" 'BEGIN {exit !(n > 0)}'; then
		pass "$name/host-rolim-throttled"
	else
		fail "$name/host-rolim-throttled" "volfsd_qos_throttled_requests_total{volume=\"rolim\"}: ${throttled:-none}"
	fi
}

# ---------------------------------------------------------------- boot

KERNEL="$REPO/build/guest/vmlinuz"
INITRD="$REPO/build/guest/initramfs.cpio.gz"
FS_SOCK=""

# boot NAME SHARE: daemon and VM NAME, until the guest's workload runs
boot() {
	local name=$1 share=$2 attempt
	for attempt in $(seq "$BOOT_ATTEMPTS"); do
		BREAK=""
		((attempt > ${VMTEST_BREAK_BOOTS:-0})) || BREAK=" rdinit=/bin/false"
		start_daemon "$name" "$share" "$FS_SOCK" "${KEEP_SERVING[@]}"
		ch "$name" "${SECCOMP[@]}" --kernel "$KERNEL" --initramfs "$INITRD" --cmdline "$(cmdline)" \
			--cpus boot=1 --memory "size=${MEM}M,shared=on" \
			--fs "tag=share,socket=$FS_SOCK,num_queues=1,queue_size=1024" \
			--serial tty --console off
		say "cloud-hypervisor $name (pid ${VPID[$name]}): ${MEM}M, 1 cpu, mode $GUEST_MODE"
		if wait_serial "$name" '^VMTEST INIT$' "$BOOT_TIMEOUT"; then
			break
		fi
		say "boot attempt $attempt/$BOOT_ATTEMPTS never reached /init"
		show_tail "${SERIAL[$name]}" "console of $name"
		show_tail "$LOG_DIR/ch-$name.log" "cloud-hypervisor $name log"
		stop_pid "${VPID[$name]}"
		stop_pid "${DPID[$name]}"
		cp "${SERIAL[$name]}" "$LOG_DIR/serial-$name.failed-boot-$attempt.log"
		if ((attempt == BOOT_ATTEMPTS)); then
			fail boot "the guest never reached /init in $BOOT_ATTEMPTS boots"
			return 1
		fi
	done
	BREAK=""
	say "guest $name reached /init"
	if [[ $GUEST_MODE == chro ]]; then
		if ! wait_serial "$name" '^VMTEST SYNC attach-rolim$' 300; then
			fail "$name/attach-rolim" "the guest never asked for it"
			return 1
		fi
		rolim_attach "$name" "${ROLIM_LIMIT[@]}"
	fi
	if ! wait_serial "$name" '^VMTEST SYNC workload-running$' 300; then
		fail "$name/workload-running" "the guest's workload never started"
		show_tail "${SERIAL[$name]}" "console of $name"
		return 1
	fi
	say "guest $name: workload running"
}

# ---------------------------------------------------------------- snapshot

# restore NAME SNAPDIR: cloud-hypervisor NAME restores SNAPDIR (its daemon
# listening), then resume; 0 once the guest runs
restore() {
	local name=$1 dir=$2 t0 t1
	t0=$(date +%s.%N)
	ch "$name" "${SECCOMP[@]}" --restore "source_url=file://$dir"
	if ! wait_state "$name" Paused 180; then
		say "restore $name failed: $(grep -aE 'ERROR|Error' "$LOG_DIR/ch-$name.log" | tail -n 2 | sed 's/^.*-- //' | tr '\n' ' ')"
		return 1
	fi
	t1=$(date +%s.%N)
	chr "$name" resume >/dev/null || { say "ch-remote resume of $name failed"; return 1; }
	wait_state "$name" Running 60 || return 1
	timing "restore $name: $(echo "$t1 - $t0" | bc | awk '{printf "%.2f", $1}') s to a paused VM, resumed after $(elapsed "$t0") s in all"
}

# show_failure NAME: VMM NAME's log and its daemon's, once both are gone
show_failure() {
	local d=${DAEMON_OF[$1]:-$1}
	[[ -z ${VPID[$1]:-} ]] || gone_within "${VPID[$1]}" 5 || stop_pid "${VPID[$1]}"
	[[ -z ${DPID[$d]:-} ]] || gone_within "${DPID[$d]}" 10 || stop_pid "${DPID[$d]}"
	show_tail "$LOG_DIR/ch-$1.log" "cloud-hypervisor $1 log"
	show_tail "$LOG_DIR/daemon-$d.log" "daemon $d log"
}

# clone_snapshot SRC DST SOCKET: a copy of snapshot SRC whose VM uses SOCKET
# (memory-ranges linked, config.json and state.json rewritten)
clone_snapshot() {
	mkdir -p "$2"
	ln -s "$1/memory-ranges" "$2/memory-ranges"
	local f
	for f in "$1"/*; do
		[[ $(basename "$f") == memory-ranges ]] && continue
		python3 - "$f" "$2/$(basename "$f")" "$FS_SOCK" "$3" <<'PY'
import sys
src, dst, old, new = sys.argv[1:]
data = open(src).read()
open(dst, "w").write(data.replace(old, new))
PY
	done
	grep -q "$3" "$2/config.json" || die "clone_snapshot: $2/config.json does not name $3"
}

mode_snapshot() {
	local m=$SHARE/data/migr t0 snap=$WORK/snap
	GUEST_MODE=chro
	[[ $VIRTIOFSD == 0 ]] || GUEST_MODE=chdata
	mkdir -p "$SHARE/data" "$SHARE/rolim"
	"$FSOPS_HOST" pattern write "$SHARE/rolim/ro.dat" 1 7
	chmod 0777 "$SHARE/data"
	boot src "$SHARE" || return 0
	watch_locks snap "$m/locked"
	sleep "$PRE"
	t0=$(date +%s.%N)
	if ! chr src pause >/dev/null; then
		fail src/pause "ch-remote pause failed"
		finish_on src "$m" src snap
		return 0
	fi
	timing "pause src: $(elapsed "$t0") s"
	mkdir -p "$snap"
	t0=$(date +%s.%N)
	if ! chr src snapshot "file://$snap" >"$LOG_DIR/snapshot-src.txt" 2>&1; then
		fail src/snapshot "ch-remote snapshot: $(tr '\n' ' ' <"$LOG_DIR/snapshot-src.txt") $(grep -aE 'ERROR|Error' "$LOG_DIR/ch-src.log" | tail -n 2 | sed 's/^.*-- //' | tr '\n' ' ')"
		unwatch_locks snap "until the snapshot failed"
		return 0
	fi
	pass src/snapshot
	timing "snapshot src: $(elapsed "$t0") s, $(du -sm "$snap" | cut -f1) MB; guest lines so far $(lines_of "$m")"
	# The copies for the clones: the share as the snapshot left it (src paused).
	cp -a "$SHARE" "$WORK/copy1"
	cp -a "$SHARE" "$WORK/copy2"
	say "copies of the share made while src is paused: $WORK/copy1, $WORK/copy2 ($(lines_of "$m") lines)"

	# virtiofsd holds a lock on a pid file beside its socket (SOCKET.pid): a second
	# virtiofsd on the same path refuses to start while the source's runs. So for
	# virtiofsd the source is let go first, and its guest's locks are free until
	# the restore (volfsd's restored daemon starts beside the source's and takes its
	# lock files over).
	if [[ $VIRTIOFSD == 1 ]]; then
		say "virtiofsd: the source's VMM and virtiofsd stop before the restore (its pid file on the socket path)"
		chr src shutdown-vmm >/dev/null 2>&1 || true
		vmm_gone src
		collect src
		daemon_exit src src/daemon-exit-0
	fi
	# A fresh daemon on the same socket path (the snapshot's configuration names
	# it), rolim attached before the restore, without the limit.
	start_daemon restored "$SHARE" "$FS_SOCK"
	[[ $VIRTIOFSD == 1 ]] || rolim_attach restored
	if restore restored "$snap"; then
		pass restored/restore
	else
		fail restored/restore "cloud-hypervisor --restore and resume failed"
		show_failure restored
		unwatch_locks snap "until the restore failed"
		return 0
	fi
	[[ $VIRTIOFSD == 1 ]] || rolim_is restored host-rolim-limit-came-with-the-state '"rate_limiter":{"ops":{"size":10,'
	# src is let go only now: on one host the restored daemon took its lock
	# files over, so the locks were held throughout.
	if [[ $VIRTIOFSD == 0 ]]; then
		chr src shutdown-vmm >/dev/null 2>&1 || true
		vmm_gone src
		collect src
		daemon_exit src src/daemon-exit-0
	fi
	guest_goes_on restored "$m" || true
	sleep "$POST"
	finish_on restored "$m" restored snap

	# The clones: the same snapshot twice at once, each into its own copy.
	local c sum
	sum=$(cd "$SHARE" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum)
	for c in 1 2; do
		clone_snapshot "$snap" "$WORK/snap-clone$c" "$WORK/fs-clone$c.sock"
		start_daemon "clone$c" "$WORK/copy$c" "$WORK/fs-clone$c.sock"
		[[ $VIRTIOFSD == 1 ]] || rolim_attach "clone$c"
	done
	for c in 1 2; do
		if restore "clone$c" "$WORK/snap-clone$c"; then
			pass "clone$c/restore"
			watch_locks "clone$c" "$WORK/copy$c/data/migr/locked"
		else
			fail "clone$c/restore" "cloud-hypervisor --restore and resume failed"
			show_failure "clone$c"
		fi
	done
	for c in 1 2; do
		[[ -n ${VPID[clone$c]:-} ]] && kill -0 "${VPID[clone$c]}" 2>/dev/null && { guest_goes_on "clone$c" "$WORK/copy$c/data/migr" || true; }
	done
	sleep "$POST"
	for c in 1 2; do stop_guest "$WORK/copy$c/data/migr" "clone$c"; done
	for c in 1 2; do
		[[ -n ${VPID[clone$c]:-} ]] || continue
		finish_guest "clone$c" "$WORK/copy$c/data/migr"
		host_checks "clone$c" "$WORK/copy$c/data/migr" "clone$c"
	done
	# Each clone wrote into its own copy only; the share is as it was.
	clone_share_checks "$sum" restored data/migr "$SHARE" "$WORK/copy1" "$WORK/copy2"
}

# ---------------------------------------------------------------- live

# migrate SRC DST HOW [DAEMON ARGS...]: a live migration of VM SRC to a new VMM
# DST; HOW is local (a unix socket, local=on, DST on SRC's daemon) or tcp (DST on
# a new daemon, named DST too, on the same socket path, started with ARGS)
migrate() {
	local src=$1 dst=$2 how=$3 url recv send t0 line
	shift 3
	case $how in
	local)
		DAEMON_OF[$dst]=${DAEMON_OF[$src]:-$src}
		url=unix:$WORK/mig-$dst.sock
		recv=receiver_url=$url send=destination_url=$url,local=on
		;;
	tcp)
		start_daemon "$dst" "$SHARE" "$FS_SOCK" "$@"
		DAEMON_OF[$dst]=$dst
		url=tcp:127.0.0.1:$((20000 + RANDOM % 20000))
		recv=receiver_url=$url send=destination_url=$url
		;;
	esac
	ch "$dst" "${SECCOMP[@]}"
	chr "$dst" receive-migration "$recv" >"$LOG_DIR/receive-$dst.txt" 2>&1 &
	local rpid=$!
	# The receiver listens once its API call is in.
	for _ in $(seq 100); do
		case $how in
		local) [[ -S $WORK/mig-$dst.sock ]] && break ;;
		tcp) ss -tln 2>/dev/null | grep -q ":${url##*:} " && break ;;
		esac
		sleep 0.1
	done
	say "ch-remote $src send-migration $send (daemon ${DAEMON_OF[$dst]} serves $dst)"
	t0=$(date +%s.%N)
	if ! chr "$src" send-migration "$send" >"$LOG_DIR/send-$src.txt" 2>&1; then
		say "send-migration refused: $(tr '\n' ' ' <"$LOG_DIR/send-$src.txt")"
	fi
	if ! wait_state "$dst" Running 300; then
		wait "$rpid" 2>/dev/null || true
		say "migration $src -> $dst ($how) failed: $(grep -ahE 'ERROR|Error' "$LOG_DIR/ch-$src.log" "$LOG_DIR/ch-$dst.log" | tail -n 3 | sed 's/^.*-- //' | tr '\n' ' ')"
		return 1
	fi
	wait "$rpid" 2>/dev/null || true
	line=$(grep -ah 'Migration completed after' "$LOG_DIR/ch-$src.log" | tail -n 1 | sed 's/^.*-- //')
	timing "migration $src -> $dst ($how): $dst running $(elapsed "$t0") s after send-migration; source: ${line:-no completion line}"
}

# The live mode's daemons: cloud-hypervisor disconnects the source's back-end at
# the end of its save, before the destination VMM connects to the socket path.
# A daemon that exited then would let go of the guest's lock files before the
# destination took them over, so the source daemons run with --keep-serving: one
# serves a local migration's destination itself (as docs/MIGRATION.md says for
# local=on), and one keeps offering the lock files to the new daemon of a TCP
# migration until the runner stops it (SIGTERM, exit 0) once the destination
# runs.
# cloud-hypervisor (v53.0 and main-ae44c29) cannot migrate a VM that came in by a
# migration or a restore over TCP (it drops VHOST_F_LOG_ALL from the device's
# features then: MigrationNotSupported), and the guest it resumes after that
# refusal hangs or triple-faults within seconds (docs/MIGRATION.md, found here);
# local=on works. So the legs are a1 -> b1 over TCP, then b1 -> a2 -> b2 with
# local=on (twice on one daemon): there and back with local=on, there over TCP.
mode_live() {
	local m=$SHARE/data/migr prev=a1 step next how args old why
	GUEST_MODE=chdata
	# VMTEST_CH_MIGRATION_SECCOMP=true: cloud-hypervisor's own filter on (to see
	# whether a version still kills its migration thread).
	SECCOMP=(--seccomp "${VMTEST_CH_MIGRATION_SECCOMP:-log}")
	mkdir -p "$SHARE/data"
	chmod 0777 "$SHARE/data"
	# virtiofsd has no --keep-serving: its run shows what a plain back-end gets.
	[[ $VIRTIOFSD == 1 ]] || KEEP_SERVING=(--keep-serving)
	boot a1 "$SHARE" || return 0
	DAEMON_OF[a1]=a1
	[[ $VIRTIOFSD == 1 ]] || KS[a1]=1
	watch_locks live "$m/locked"
	sleep "$PRE"
	for step in "b1 tcp --keep-serving" "a2 local" "b2 local"; do
		read -r next how args <<<"$step"
		[[ $VIRTIOFSD == 0 ]] || args=${args//--keep-serving/}
		old=${DAEMON_OF[$prev]}
		[[ $args != *--keep-serving* ]] || KS[$next]=1
		# shellcheck disable=SC2086 # daemon arguments
		if ! migrate "$prev" "$next" "$how" $args; then
			why=$(grep -ah 'Migration failed:' "$LOG_DIR/ch-$prev.log" | tail -n 1 | sed 's/^.*-- //')
			fail "$prev/live-migration-$how" "to $next: ${why:-see ch-$prev.log and ch-$next.log}"
			show_failure "$next"
			# The guest finishes where it is, if it still runs there.
			if [[ $(vm_state "$prev") == Running ]]; then
				finish_on "$prev" "$m" "$prev" live
			else
				unwatch_locks live "until the migration failed"
			fi
			return 0
		fi
		pass "$prev/live-migration-$how-to-$next"
		vmm_gone "$prev"
		collect "$prev"
		if [[ $how == tcp ]]; then
			# The source's daemon (--keep-serving) handed the lock files over: stop it.
			kill -TERM "${DPID[$old]}" 2>/dev/null || true
			daemon_exit "$old" "$old/source-daemon-exit-0-after-sigterm"
		fi
		guest_goes_on "$next" "$m" || true
		sleep "$PRE"
		prev=$next
	done
	finish_on "$prev" "$m" "$prev" live
}

# ---------------------------------------------------------------- reconnect

# The daemon's processes: the launched one and everything below it.
tree_of() {
	local p=$1 k
	echo "$p"
	for k in $(cat /proc/"$p"/task/*/children 2>/dev/null); do tree_of "$k"; done
}

mode_reconnect() {
	local m=$SHARE/data/migr i pids n0 t0 name=vm line took
	GUEST_MODE=chdata
	mkdir -p "$SHARE/data"
	chmod 0777 "$SHARE/data"
	local up=()
	[[ $VIRTIOFSD == 1 ]] || up=(--upgradable)
	DAEMON_ARGS="$DAEMON_ARGS ${up[*]}"
	boot "$name" "$SHARE" || return 0
	sleep "$PRE"
	for i in $(seq "$RECONNECTS"); do
		pids=$(tree_of "${DPID[$name]}" | tr '\n' ' ')
		n0=$(grep -c 'handed back the session region' "$LOG_DIR/daemon-$name.log" || true)
		say "reconnect $i: SIGKILL to the whole daemon: $pids"
		t0=$(date +%s.%N)
		# shellcheck disable=SC2086 # a list of pids
		kill -KILL $pids
		wait "${DPID[$name]}" 2>/dev/null || true
		echo "---- reconnect $i: the daemon SIGKILLed whole and started again ----" >>"$LOG_DIR/daemon-$name.log"
		start_daemon "$name" "$SHARE" "$FS_SOCK"
		if [[ $VIRTIOFSD == 0 ]]; then
			took=0
			for _ in $(seq 600); do
				(($(grep -c 'handed back the session region' "$LOG_DIR/daemon-$name.log" || true) > n0)) && { took=1; break; }
				kill -0 "${DPID[$name]}" 2>/dev/null || break
				sleep 0.1
			done
			line=$(grep 'handed back the session region' "$LOG_DIR/daemon-$name.log" | tail -n 1)
			if [[ $took == 1 ]]; then
				pass "$name/reconnect-$i-session-handed-back"
				timing "reconnect $i: session taken back $(elapsed "$t0") s after the kill: ${line##*keeper: }"
			else
				fail "$name/reconnect-$i-session-handed-back" "no 'handed back the session region' in 60 s: $(tail -n 3 "$LOG_DIR/daemon-$name.log" | tr '\n' ' ' | cut -c1-400)"
			fi
		fi
		guest_goes_on "$name" "$m" || break
		sleep "$PRE"
	done
	finish_on "$name" "$m" "$name"
}

# ---------------------------------------------------------------- main

trap cleanup EXIT
trap 'exit 130' INT TERM
trap 'say "command failed (status $?) at line $LINENO: $BASH_COMMAND"' ERR
ch_setup "$REQUIRE"
[[ -n $CH_REMOTE && -x $CH_REMOTE ]] || { fail ch-remote "no ch-remote next to $CH_BIN or on PATH (CH_REMOTE)"; echo "$PASSED passed, $FAILED failed"; exit 1; }
if [[ ${VMTEST_IN_L1:-0} != 1 ]]; then
	"$HERE/build-guest.sh" --quiet >/dev/null
fi
mkdir -p "$LOG_DIR"
if [[ $CH_MODE == nested ]]; then
	t=$SECONDS
	# The snapshot mode runs up to three guests at once, a snapshot and two
	# copies of the share in L1's memory.
	l1mem=$((MEM * 5 + 1536))
	ch_nested_exec "$LOG_DIR" "$l1mem" "$L1_SMP" 5400 "$0" "${ORIG_ARGS[@]}" --daemon "$(l1_visible "$DAEMON" "$LOG_DIR")" --log-dir "$LOG_DIR"
	say "mode $MODE took $((SECONDS - t)) s (nested, L1 boot included)"
	FINISHED=1
	echo "$PASSED passed, $FAILED failed"
	[[ $FAILED == 0 ]] || exit 1
	exit 0
fi
rm -f "$LOG_DIR"/*.log "$LOG_DIR"/*.txt
WORK=$(mktemp -d /var/tmp/volfsd-ch-migration.XXXXXX)
SHARE=$WORK/share
FS_SOCK=$WORK/fs.sock
mkdir "$SHARE"
if [[ -x ${VMTEST_FSOPS_HOST:-} ]]; then
	FSOPS_HOST=$VMTEST_FSOPS_HOST
else
	FSOPS_HOST=$WORK/fsops-host
	gcc -O2 -Wall -o "$FSOPS_HOST" "$HERE/guest/fsops.c"
fi
[[ $VIRTIOFSD == 0 ]] || say "virtiofsd: its results are recorded, not judged, by run-ch-compare.sh"
say "mode $MODE: daemon $DAEMON${DAEMON_ARGS:+ $DAEMON_ARGS}, $CH_VERSION_TEXT, cache=$(cache_mode), logs in $LOG_DIR"
"mode_$MODE"
say "mode $MODE took $(echo "$(date +%s.%N) - $T_START" | bc | cut -d. -f1) s"
FINISHED=1
echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]] || exit 1
