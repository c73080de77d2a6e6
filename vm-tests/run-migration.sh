#!/usr/bin/env bash
# A guest whose virtio-fs share is served by a vhost-user-fs daemon (volfsd, or
# virtiofsd for comparison) moved by QEMU 10 while it works (issue 24): live
# migration to a second QEMU with its own daemon, a snapshot to a file restored
# by a new QEMU and a new daemon, clones restored into copies of the share, a
# file deleted between snapshot and restore, and volumes attached at runtime,
# read-only, rate-limited and kept by file handle. The guest runs
# suites/migration.sh: it holds an appending fd, a reading fd, a directory in
# the middle of its readdir, its cwd, a POSIX lock and an flock, a shared map
# and fio with verify, and checks them all after the move, which it never sees
# coming. Meanwhile a host process (fsops lockwatch, built for the host) tries
# the guest's locks every 5 ms and must be refused whenever a VM runs.
#
# Usage: vm-tests/run-migration.sh --mode MODE [options]
#   --mode live|snapshot|clone|checkpoint|gone|variants   (see below; required)
#   --daemon PATH          daemon binary (default target/release/volfsd)
#   --daemon-args "..."    extra arguments of every daemon (word-split), e.g.
#                          "--allow-mmap" for virtiofsd
#   --no-host-locks        do not try the guest's locks from the host (for
#                          virtiofsd, which leaves locks to the guest's kernel)
#   --mem SIZE             guest RAM (default 512M)
#   --log-dir DIR          logs (default build/vm-logs/migration-MODE)
#   --boot-attempts N      a boot that never reaches /init is retried (default 3)
#   --stop-first           snapshots of a paused VM: QMP stop before migrate to
#                          file: (the daemon then gets no dirty-log setup, only
#                          the state save); restored VMs come back paused and
#                          get QMP cont
#   --keep                 keep the temp dir (shares, snapshot file)
#
# Modes (each boots one guest; its checks are named after the VM that ran them):
#   live      src boots on daemon src; dst (QEMU -incoming defer, daemon dst,
#             same share) takes it over with QMP migrate (return-path on);
#             the source QEMU quits and its daemon must exit 0; the guest
#             finishes on dst.
#   snapshot  QMP migrate to file: of the running src; src quits (VM and daemon
#             gone); a new QEMU with a new daemon restores it (migrate-incoming
#             file:) on the same share: VM "original".
#   clone     the snapshot mode, then the same snapshot restored twice more, into
#             two copies of the share made (cp -a) while no VM ran: clone1 and
#             clone2 run at once, each on its copy; each one's writes land in
#             its copy only, and the original share is left alone.
#   checkpoint  QMP migrate to file: of the running src, then cont: src carries
#             on with its daemon (a checkpoint, as a platform takes one of a
#             sandbox that keeps running) and the guest finishes there; its
#             locks must still go when it lets them go.
#   gone      snapshot of src; victim1 (held open by the guest) deleted on the
#             host; a restore with the default --migration-on-error (abort)
#             must fail (QEMU's error, and the daemon's log naming the file); a
#             restore with guest-error runs (VM "restored"): victim1's fd fails
#             (EIO or ESTALE), all else carries on; then victim2 deleted on the
#             host and a live migration to a daemon with the default (abort)
#             must fail (QEMU's error and the daemon's reason), leaving
#             "restored" running with its share.
#   variants  volfsd only: a volume "data" attached at runtime through the
#             control socket holds the workload, a read-only volume "ro" and
#             a rate-limited one "slow" (ops_size=100 per second) hold a reading
#             fd each, every daemon has --inode-file-handles=prefer. Live
#             migration to dst (data attached through dst's control socket
#             before the load; slow given there without a limit: it must come
#             with the state), then a snapshot of dst; a restore whose daemon
#             lacks data must fail naming it; one with data attached runs.
#
# Logs per VM NAME: serial-NAME.log, qemu-NAME.log, daemon-NAME.log; the lock
# watcher's lockwatch-NAME.log; query-migrate-NAME.json. The script prints each
# result and ends with "N passed, N failed"; exit status 0 only if nothing
# failed. QEMU 10 is needed (tests/install-deps.sh installs it).
# VMTEST_BREAK_BOOTS=N makes the first N boots fail (as in run-vm.sh), to test
# the retry of a boot that never reaches /init.
set -eEuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=runner-lib.sh
. "$HERE/runner-lib.sh"

MODE=""
DAEMON="$REPO/target/release/volfsd"
DAEMON_ARGS=""
HOST_LOCKS=1
MEM=512M
LOG_DIR=""
BOOT_ATTEMPTS=3
BOOT_TIMEOUT=180 # seconds from QEMU start to the guest's VMTEST INIT (TCG)
KEEP=0
STOP_FIRST=0
PRE=2  # seconds the guest works before a move
POST=2 # ... and after it, before the host writes the stop file

WORK=""
declare -A DPID=() QPID=() LWPID=()

PASSED=0
FAILED=0
T_START=$(date +%s.%N)

say() { printf 'run-migration: [%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $T_START" | bc)" "$*"; }
die() {
	echo "run-migration: error: $*" >&2
	exit 2
}
usage() {
	sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
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
	--keep) KEEP=1 ;;
	--stop-first) STOP_FIRST=1 ;;
	-h | --help) usage 0 ;;
	*) echo "run-migration: unknown option: $1" >&2; usage 2 ;;
	esac
	shift
done
case $MODE in live | snapshot | clone | checkpoint | gone | variants) ;; *) die "--mode must be live, snapshot, clone, checkpoint, gone or variants" ;; esac
[[ -x $DAEMON ]] || die "daemon '$DAEMON' is not an executable (cargo build --release, or pass --daemon)"
DAEMON=$(readlink -f "$DAEMON")
[[ $EUID == 0 ]] || die "needs root (the variants mode bind-mounts volumes; volfsd's sandbox)"
MEM=${MEM^^}
case $MEM in *G) MEM=$((${MEM%G} * 1024)) ;; *M) MEM=${MEM%M} ;; esac
[[ $MEM =~ ^[0-9]+$ ]] || die "bad --mem"
LOG_DIR=${LOG_DIR:-$REPO/build/vm-logs/migration-$MODE}
if [[ $MODE == variants ]] && ! "$DAEMON" --help 2>&1 | grep -q -- --control-socket; then
	die "the variants mode needs volfsd's --control-socket ($DAEMON has none)"
fi

# ---------------------------------------------------------------- processes

FINISHED=0
cleanup() {
	local p
	if [[ $FINISHED == 0 && -n $MODE ]]; then
		fail runner "run-migration.sh stopped before the end of the $MODE mode (see above)"
		echo "$PASSED passed, $FAILED failed"
	fi
	for p in "${QPID[@]}" "${LWPID[@]}" "${DPID[@]}"; do stop_pid "$p" 2; done
	if [[ -n $WORK ]]; then
		awk -v d="$WORK" 'index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
			while read -r m; do umount -l "$m" 2>/dev/null || true; done
		if [[ $KEEP == 1 ]]; then say "kept $WORK"; else rm -rf "$WORK"; fi
	fi
}

# The daemon's word for "no caching" (volfsd: none, virtiofsd: never).
cache_mode() {
	if "$DAEMON" --help 2>&1 | awk '/^ *--cache/ {f = 1; next} /^ *--[a-z]/ {f = 0} f' | grep -qw none; then
		echo none
	else
		echo never
	fi
}

start_daemon() { # start_daemon NAME SHARE [ARGS...]: daemon NAME on socket WORK/NAME.sock
	local name=$1 share=$2 sock=$WORK/$1.sock
	shift 2
	rm -f "$sock"
	# shellcheck disable=SC2086 # --daemon-args is word-split by design
	"$DAEMON" --socket-path="$sock" --shared-dir="$share" --cache="$CACHE" $DAEMON_ARGS "$@" \
		>"$LOG_DIR/daemon-$name.log" 2>&1 &
	DPID[$name]=$!
	for _ in $(seq 100); do
		[[ -S $sock ]] && { say "daemon $name (pid ${DPID[$name]}) on $share${*:+: $*}"; return 0; }
		kill -0 "${DPID[$name]}" 2>/dev/null || break
		sleep 0.1
	done
	show_tail "$LOG_DIR/daemon-$name.log" "daemon $name log"
	die "daemon $name did not create its socket"
}

if [[ -r /dev/kvm && -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo &&
	echo quit | timeout 20 qemu-system-x86_64 -accel kvm -machine none -nodefaults -display none \
		-monitor stdio >/dev/null 2>&1; then
	ACCEL=kvm CPU=host
else
	ACCEL=tcg,thread=multi CPU=max
fi

BREAK="" # VMTEST_BREAK_BOOTS=N (as in run-vm.sh): the first N boots never reach /init

start_qemu() { # start_qemu NAME [QEMU ARGS...]: QEMU NAME on daemon NAME's socket
	local name=$1
	shift
	: >"$LOG_DIR/serial-$name.log"
	# Both ends of a migration need the very same machine: same memory backend
	# (shared: the daemon maps it), device line and kernel command line.
	qemu-system-x86_64 \
		-machine q35 -accel "$ACCEL" -cpu "$CPU" -smp 1 -m "${MEM}M" \
		-object "memory-backend-memfd,id=mem,size=${MEM}M,share=on" -numa node,memdev=mem \
		-chardev "socket,id=char0,path=$WORK/$name.sock" \
		-device vhost-user-fs-pci,chardev=char0,tag=share,num-request-queues=1,queue-size=1024 \
		-kernel "$REPO/build/guest/vmlinuz" -initrd "$REPO/build/guest/initramfs.cpio.gz" \
		-append "console=ttyS0 panic=-1 quiet vmtest.suite=migration vmtest.migration=$MODE$BREAK" \
		-nodefaults -display none -monitor none -serial "file:$LOG_DIR/serial-$name.log" \
		-nic none -no-reboot -msg timestamp=on \
		-qmp "unix:$WORK/qmp-$name.sock,server=on,wait=off" "$@" >"$LOG_DIR/qemu-$name.log" 2>&1 &
	QPID[$name]=$!
	say "qemu $name (pid ${QPID[$name]}, accel=$ACCEL, ${MEM}M)${*:+: $*}"
}

qmp() { python3 "$HERE/qmp.py" "$WORK/qmp-$1.sock" "${@:2}"; }

# The serial console's complete lines (QEMU writes a line in pieces).
serial_lines() {
	local text
	text=$(tr -d '\r\0' <"$LOG_DIR/serial-$1.log" 2>/dev/null; echo .)
	text=${text%.}
	case "$text" in *$'\n') ;; *$'\n'*) text=${text%$'\n'*}$'\n' ;; *) text="" ;; esac
	printf '%s' "$text"
}

# wait_serial NAME REGEX SECS: until a line of NAME's console matches; 1 on a
# timeout or when QEMU NAME exits first
wait_serial() {
	local t0=$SECONDS
	until serial_lines "$1" | grep -qaE "$2"; do
		((SECONDS - t0 < $3)) || return 1
		kill -0 "${QPID[$1]}" 2>/dev/null || { serial_lines "$1" | grep -qaE "$2"; return; }
		sleep 0.2
	done
}

gone_within() { # gone_within PID SECS: the process ends within SECS
	for _ in $(seq $(($2 * 10))); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.1
	done
	! kill -0 "$1" 2>/dev/null
}

# daemon_exit NAME CHECK: daemon NAME, whose QEMU is gone, must exit 0
daemon_exit() {
	local pid=${DPID[$1]} status=0
	if ! gone_within "$pid" 20; then
		fail "$2" "daemon $1 still runs 20 s after its QEMU went away"
		stop_pid "$pid"
		return
	fi
	wait "$pid" || status=$?
	if [[ $status == 0 ]]; then pass "$2"; else fail "$2" "daemon $1 exited with status $status ($(grep -iE 'error|panic' "$LOG_DIR/daemon-$1.log" | tail -n 2 | tr '\n' ' '))"; fi
}

qemu_quit() { # qemu_quit NAME: QMP quit, and wait for the process
	qmp "$1" quit >/dev/null 2>&1 || true
	gone_within "${QPID[$1]}" 20 || stop_pid "${QPID[$1]}"
	wait "${QPID[$1]}" 2>/dev/null || true
}

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

# watch_locks NAME FILE: a host process tries FILE's locks until unwatch_locks
watch_locks() {
	[[ $HOST_LOCKS == 1 ]] || return 0
	rm -f "$WORK/lockwatch-$1.stop"
	"$FSOPS_HOST" lockwatch "$2" "$WORK/lockwatch-$1.stop" 5 >"$LOG_DIR/lockwatch-$1.log" 2>&1 &
	LWPID[$1]=$!
	say "host tries the locks on $2 every 5 ms (lockwatch-$1.log)"
}

# unwatch_locks NAME WHAT: stop the watcher; it must never have got a lock
unwatch_locks() {
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

# guest_goes_on NAME DIR: the guest's appender, seen on the host, goes on
guest_goes_on() {
	local n0 t0=$SECONDS
	n0=$(lines_of "$2")
	until (($(lines_of "$2") >= n0 + 5)); do
		if ((SECONDS - t0 > 30)); then
			fail "$1/guest-goes-on" "append.log stayed at $(lines_of "$2") lines for 30 s (from $n0)"
			return
		fi
		sleep 0.2
	done
	pass "$1/guest-goes-on"
}

# ack NAME DIR STEP: answer the guest's step with "ok" in DIR/.acks/STEP
ack() {
	mkdir -p "$2/.acks"
	printf 'ok\n' >"$2/.acks/.$3.tmp" && mv "$2/.acks/.$3.tmp" "$2/.acks/$3"
}

stop_guest() { # stop_guest DIR WHO: the guest's workload ends; WHO names the VM
	printf '%s\n' "$2" >"$1/.stop.tmp" && mv "$1/.stop.tmp" "$1/stop"
}

# finish_guest NAME DIR [WATCHER]: after stop_guest: the guest checks, the host
# stops trying its locks (lock watcher WATCHER, default NAME), the guest lets
# them go and powers off; its daemon exits 0
finish_guest() {
	local name=$1 dir=$2 watcher=${3:-$1}
	if wait_serial "$name" '^VMTEST SYNC release-locks$' 240; then
		unwatch_locks "$watcher" "from before the move until the guest's checks ended"
		[[ $MODE != variants ]] || variants_after "$name"
		ack "$name" "$dir" release-locks
	else
		unwatch_locks "$watcher" "(the guest never asked to release them)"
		fail "$name/release-locks" "the guest never got to its release-locks step"
	fi
	if wait_serial "$name" '^VMTEST DONE$' 120 && gone_within "${QPID[$name]}" 30; then
		say "guest $name powered off"
	else
		fail "$name/guest-done" "no VMTEST DONE and power-off within 150 s"
		show_tail "$LOG_DIR/serial-$name.log" "serial console of $name"
		stop_pid "${QPID[$name]}"
	fi
	wait "${QPID[$name]}" 2>/dev/null || true
	collect "$name"
	daemon_exit "$name" "$name/daemon-exit-0"
}

# finish_on NAME DIR WHO [WATCHER]: the guest on NAME ends its workload, checks
# and powers off; then the host's checks of what it left
finish_on() {
	stop_guest "$2" "$3"
	finish_guest "$1" "$2" "${4:-$1}"
	host_checks "$1" "$2" "$3"
}

# host_checks NAME DIR WHO: what the guest left in DIR (the host path of its
# work dir): every appended line exactly once, the map's writes
host_checks() {
	local name=$1 dir=$2 who=$3 n
	n=$(grep -c '^[0-9]*$' "$dir/append.log" || true)
	if awk -v n="$n" 'NR <= n && $1 != NR {exit 1} END {exit NR != n + 1}' "$dir/append.log" &&
		[[ $(tail -n 1 "$dir/append.log") == "end $who" ]]; then
		pass "$name/host-append-lines-exactly-once"
		say "$name: the host has append.log lines 1..$n and 'end $who'"
	else
		fail "$name/host-append-lines-exactly-once" "append.log is not 1..N then 'end $who': $(awk '$1 != NR {print NR ": " $0; exit}' "$dir/append.log"), last: $(tail -n 1 "$dir/append.log")"
	fi
	local before after
	before=$(dd if="$dir/mapped" bs=1 count=11 2>/dev/null)
	after=$(dd if="$dir/mapped" bs=1 skip=128 count=10 2>/dev/null)
	if [[ $before == before-move && $after == after-move ]]; then
		pass "$name/host-map-writes-landed"
	else
		fail "$name/host-map-writes-landed" "the host's mapped file reads '$before' at 0 and '$after' at 128"
	fi
}

# ---------------------------------------------------------------- moves

# boot NAME SHARE [DAEMON ARGS...]: until the guest's workload runs
boot() {
	local name=$1 attempt
	for attempt in $(seq "$BOOT_ATTEMPTS"); do
		BREAK=""
		((attempt > ${VMTEST_BREAK_BOOTS:-0})) || BREAK=" rdinit=/bin/false"
		start_daemon "$@"
		start_qemu "$name"
		wait_serial "$name" '^VMTEST INIT$' "$BOOT_TIMEOUT" && break
		say "boot attempt $attempt/$BOOT_ATTEMPTS never reached /init"
		show_tail "$LOG_DIR/serial-$name.log" "serial console"
		stop_pid "${QPID[$name]}"
		stop_pid "${DPID[$name]}"
		cp "$LOG_DIR/serial-$name.log" "$LOG_DIR/serial-$name.failed-boot-$attempt.log"
		if ((attempt == BOOT_ATTEMPTS)); then
			fail boot "the guest never reached /init in $BOOT_ATTEMPTS boots"
			return 1
		fi
	done
	BREAK=""
	say "guest $name reached /init"
	if [[ $MODE == variants ]]; then
		wait_serial "$name" '^VMTEST SYNC attach-data$' 120 || { fail "$name/attach-data" "the guest never asked for it"; return 1; }
		local out
		if out=$("$DAEMON" ctl attach data --bind "$WORK/vol-data" --control-socket "$WORK/ctl-$name.sock" 2>&1); then
			pass "$name/host-attach-data"
		else
			fail "$name/host-attach-data" "$out"
		fi
	fi
	if ! wait_serial "$name" '^VMTEST SYNC workload-running$' 240; then
		fail "$name/workload-running" "the guest's workload never started"
		show_tail "$LOG_DIR/serial-$name.log" "serial console"
		return 1
	fi
	say "guest $name: workload running"
}

# live_migrate SRC DST: QMP migrate from SRC to DST (QEMU -incoming defer, its
# daemon running); 0 once DST runs the guest
live_migrate() {
	local src=$1 dst=$2 side rc=0 t0 t1
	for side in "$src" "$dst"; do
		qmp "$side" migrate-set-capabilities '{"capabilities":[{"capability":"return-path","state":true}]}' >/dev/null
	done
	qmp "$dst" migrate-incoming "{\"uri\":\"unix:$WORK/mig-$dst.sock\"}" >/dev/null
	say "QMP $src: migrate to $dst"
	t0=$(date +%s.%N)
	if ! qmp "$src" migrate "{\"uri\":\"unix:$WORK/mig-$dst.sock\"}" >"$LOG_DIR/query-migrate-$src.json" 2>&1; then
		say "QMP $src: migrate refused: $(mig_error "$src")"
		return 1
	fi
	qmp "$src" wait-migration 300 >"$LOG_DIR/query-migrate-$src.json" 2>>"$LOG_DIR/qmp.log" || rc=1
	t1=$(date +%s.%N)
	if [[ $rc != 0 ]]; then
		say "migration $src -> $dst failed after $(echo "$t1 - $t0" | bc) s: $(mig_error "$src")"
		return 1
	fi
	qmp "$dst" wait-status running 60 >/dev/null 2>>"$LOG_DIR/qmp.log" || { say "$dst did not start running"; return 1; }
	say "migration $src -> $dst: $(timing "$src") in $(echo "$t1 - $t0" | bc) s (QMP migrate to completed); $dst running"
}

mig_error() { # why NAME's last migration failed: query-migrate's error-desc or QMP's error
	local j=$LOG_DIR/query-migrate-$1.json
	grep -ho '"error-desc": "[^"]*"' "$j" 2>/dev/null || grep -h 'QMP' "$j" 2>/dev/null || echo "see $j"
}

timing() { # the total and downtime of NAME's last migration, from query-migrate
	local j=$LOG_DIR/query-migrate-$1.json
	echo "total $(grep -o '"total-time": [0-9]*' "$j" | grep -o '[0-9]*$') ms, downtime $(grep -o '"downtime": [0-9]*' "$j" | grep -o '[0-9]*$') ms"
}

# snapshot NAME DIR: QMP migrate to the file WORK/snap.bin, then NAME quits (its
# daemon must exit 0). The host stops trying the locks first: they go with NAME.
snapshot() {
	local name=$1 t0 t1
	t0=$(date +%s.%N)
	if [[ $STOP_FIRST == 1 ]]; then
		say "QMP $name: stop"
		qmp "$name" stop >/dev/null 2>>"$LOG_DIR/qmp.log"
	fi
	# A VM that came in with return-path (variants: dst) keeps it, and QEMU then
	# waits for a return path from the file ("Unable to read from file: Bad file
	# descriptor").
	qmp "$name" migrate-set-capabilities '{"capabilities":[{"capability":"return-path","state":false}]}' >/dev/null
	say "QMP $name: migrate to file:$WORK/snap.bin"
	if ! qmp "$name" migrate "{\"uri\":\"file:$WORK/snap.bin\"}" >"$LOG_DIR/query-migrate-$name.json" 2>&1 ||
		! qmp "$name" wait-migration 300 >"$LOG_DIR/query-migrate-$name.json" 2>>"$LOG_DIR/qmp.log"; then
		fail "$name/snapshot" "$(mig_error "$name")"
		unwatch_locks "$name" "while $name ran"
		return 1
	fi
	t1=$(date +%s.%N)
	pass "$name/snapshot"
	say "snapshot of $name: $(timing "$name") in $(echo "$t1 - $t0" | bc) s; $(du -m "$WORK/snap.bin" | cut -f1) MB; guest lines so far $(lines_of "$2")"
	unwatch_locks "$name" "while $name ran"
	qemu_quit "$name"
	daemon_exit "$name" "$name/daemon-exit-0"
}

# restore NAME SHARE [DAEMON ARGS...]: a new daemon and a new QEMU load the
# snapshot; 0 once the guest runs
restore() {
	start_daemon "$@"
	load_snapshot "$1"
}

load_snapshot() { # load_snapshot NAME: a new QEMU NAME on daemon NAME loads it
	local name=$1 t0 t1
	start_qemu "$name" -incoming defer
	t0=$(date +%s.%N)
	qmp "$name" migrate-incoming "{\"uri\":\"file:$WORK/snap.bin\"}" >/dev/null
	# A snapshot of a paused VM (--stop-first) comes back paused.
	local want=running
	[[ $STOP_FIRST == 0 ]] || want=paused
	if ! qmp "$name" wait-status "$want" 120 >/dev/null 2>>"$LOG_DIR/qmp.log"; then
		say "restore $name failed"
		return 1
	fi
	if [[ $want == paused ]]; then
		say "restore $name: paused, as the snapshot was; QMP cont"
		qmp "$name" cont >/dev/null 2>>"$LOG_DIR/qmp.log"
	fi
	t1=$(date +%s.%N)
	say "restore $name: running $(echo "$t1 - $t0" | bc) s after migrate-incoming"
}

# refused NAME CHECK WHAT: restore or migration into NAME failed; QEMU NAME
# exits with its error, and an error line of daemon NAME's log matches WHAT (an
# extended regex)
refused() {
	local name=$1 check=$2 what=$3 qerr derr
	gone_within "${QPID[$name]}" 20 || stop_pid "${QPID[$name]}"
	wait "${QPID[$name]}" 2>/dev/null || true
	qerr=$(grep -aiE 'error|fail' "$LOG_DIR/qemu-$name.log" | sed 's/^[0-9T:.Z-]* *//' | tr '\n' ' ' || true)
	derr=$(grep -aE 'ERROR|error' "$LOG_DIR/daemon-$name.log" | grep -E -- "$what" | tail -n 1 || true)
	say "QEMU $name: $qerr"
	say "daemon $name: ${derr:-nothing naming $what}"
	if [[ -n $qerr && -n $derr ]]; then
		pass "$check"
	else
		fail "$check" "QEMU's error: '${qerr:-none}'; the daemon's log line naming $what: '${derr:-none}' (its errors: $(grep -aE 'ERROR|error' "$LOG_DIR/daemon-$name.log" | tail -n 2 | tr '\n' ' ' || true))"
		show_tail "$LOG_DIR/daemon-$name.log" "daemon $name log"
	fi
	gone_within "${DPID[$name]}" 20 || stop_pid "${DPID[$name]}"
	wait "${DPID[$name]}" 2>/dev/null || true
}

# show_failure NAME: an unexpected failure of QEMU NAME to load: its log and
# its daemon's, once both are gone
show_failure() {
	gone_within "${QPID[$1]}" 5 || stop_pid "${QPID[$1]}"
	gone_within "${DPID[$1]}" 10 || stop_pid "${DPID[$1]}"
	show_tail "$LOG_DIR/qemu-$1.log" "QEMU $1 log"
	show_tail "$LOG_DIR/daemon-$1.log" "daemon $1 log"
}

# ---------------------------------------------------------------- modes

mode_live() {
	local m=$SHARE/migr
	boot src "$SHARE" || return 0
	watch_locks dst "$m/locked"
	sleep "$PRE"
	start_daemon dst "$SHARE"
	start_qemu dst -incoming defer
	if ! live_migrate src dst; then
		# The guest finishes on the source, which must run on.
		fail src/live-migration "$(mig_error src)"
		show_failure dst
		finish_on src "$m" live dst
		return 0
	fi
	pass src/live-migration
	collect src
	say "source status: $(qmp src query-status | tr -d '\n ')"
	qemu_quit src
	daemon_exit src src/source-daemon-exit-0
	guest_goes_on dst "$m"
	sleep "$POST"
	finish_on dst "$m" live
}

# The original restore of the snapshot mode, on the share itself.
restore_original() {
	local m=$SHARE/migr
	if ! restore original "$SHARE"; then
		fail original/restore "the restore failed"
		show_failure original
		return 0
	fi
	pass original/restore
	watch_locks original "$m/locked"
	guest_goes_on original "$m"
	sleep "$POST"
	finish_on original "$m" original
}

mode_snapshot() {
	boot src "$SHARE" || return 0
	watch_locks src "$SHARE/migr/locked"
	sleep "$PRE"
	snapshot src "$SHARE/migr" || { finish_on src "$SHARE/migr" snapshot-failed; return 0; }
	collect src
	if [[ $MODE == clone ]]; then
		cp -a "$SHARE" "$WORK/copy1"
		cp -a "$SHARE" "$WORK/copy2"
		say "copies of the share made while no VM runs: $WORK/copy1, $WORK/copy2 ($(lines_of "$SHARE/migr") lines)"
	fi
	restore_original
	[[ $MODE == clone ]] || return 0

	local sum c
	sum=$(cd "$SHARE" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum)
	for c in 1 2; do
		if restore "clone$c" "$WORK/copy$c"; then
			pass "clone$c/restore"
			watch_locks "clone$c" "$WORK/copy$c/migr/locked"
		else
			fail "clone$c/restore" "the restore failed"
			show_failure "clone$c"
		fi
	done
	for c in 1 2; do
		kill -0 "${QPID[clone$c]}" 2>/dev/null && guest_goes_on "clone$c" "$WORK/copy$c/migr"
	done
	sleep "$POST"
	for c in 1 2; do stop_guest "$WORK/copy$c/migr" "clone$c"; done
	for c in 1 2; do
		finish_guest "clone$c" "$WORK/copy$c/migr"
		host_checks "clone$c" "$WORK/copy$c/migr" "clone$c"
	done
	# Each clone wrote into its own copy only; the share is as it was.
	clone_share_checks "$sum" original migr "$SHARE" "$WORK/copy1" "$WORK/copy2"
}

mode_checkpoint() {
	local m=$SHARE/migr
	boot src "$SHARE" || return 0
	watch_locks src "$m/locked"
	sleep "$PRE"
	say "QMP src: migrate to file:$WORK/snap.bin (a checkpoint: src goes on)"
	if qmp src migrate "{\"uri\":\"file:$WORK/snap.bin\"}" >"$LOG_DIR/query-migrate-src.json" 2>&1 &&
		qmp src wait-migration 300 >"$LOG_DIR/query-migrate-src.json" 2>>"$LOG_DIR/qmp.log"; then
		pass src/checkpoint
		say "checkpoint of src: $(timing src); $(du -m "$WORK/snap.bin" | cut -f1) MB"
	else
		fail src/checkpoint "$(mig_error src)"
	fi
	qmp src cont >/dev/null 2>>"$LOG_DIR/qmp.log" || true
	local st
	st=$(qmp src wait-status running 30 2>&1 | tr -d '\n ' || true)
	if [[ $st == *'"running"'* ]]; then pass src/runs-on-after-checkpoint; else fail src/runs-on-after-checkpoint "status: $st"; fi
	guest_goes_on src "$m"
	sleep "$POST"
	finish_on src "$m" checkpoint
}

mode_gone() {
	local m=$SHARE/migr
	boot src "$SHARE" || return 0
	watch_locks src "$m/locked"
	sleep "$PRE"
	snapshot src "$m" || { finish_on src "$m" snapshot-failed; return 0; }
	collect src
	rm "$m/victim1"
	say "deleted $m/victim1 on the host (the guest holds it open)"
	if restore abort "$SHARE"; then
		fail abort/restore-refused "the restore succeeded though victim1 is gone"
		qemu_quit abort
	else
		refused abort abort/restore-refused-naming-the-file victim1
	fi
	if ! restore restored "$SHARE" --migration-on-error=guest-error; then
		fail restored/restore "the restore with --migration-on-error=guest-error failed"
		show_failure restored
		return 0
	fi
	pass restored/restore
	watch_locks restored "$m/locked"
	guest_goes_on restored "$m"
	rm "$m/victim2"
	say "deleted $m/victim2 on the host (the guest holds it open)"
	start_daemon abortlive "$SHARE"
	start_qemu abortlive -incoming defer
	if live_migrate restored abortlive; then
		fail restored/live-migration-refused "the live migration succeeded though victim2 is gone"
		qemu_quit restored
		finish_on abortlive "$m" gone restored
		return 0
	fi
	# The file is gone from the source's view too (it has no path any more):
	# the daemon's reason is enough here, whatever it calls the file.
	refused abortlive abortlive/live-migration-refused-with-the-daemons-reason 'device state|Failed to load state'
	local st
	st=$(qmp restored wait-status running 30 2>&1 | tr -d '\n ' || true)
	if [[ $st == *'"running"'* ]]; then
		pass restored/source-runs-on-after-refusal
	else
		fail restored/source-runs-on-after-refusal "the source's status: $st"
	fi
	guest_goes_on restored "$m"
	sleep "$POST"
	finish_on restored "$m" gone
}

# variants: the destination's checks while it serves (at release-locks)
variants_after() {
	local name=$1 js metrics throttled
	js=$("$DAEMON" ctl --json stats slow --control-socket "$WORK/ctl-$name.sock" 2>&1)
	metrics=$("$DAEMON" ctl metrics --control-socket "$WORK/ctl-$name.sock" 2>&1)
	throttled=$(grep -F 'volfsd_qos_throttled_requests_total{volume="slow"}' <<<"$metrics" | awk '{print $2}')
	say "$name: slow: $js; throttled requests: ${throttled:-none}"
	if [[ $js == *'"rate_limiter":{"ops":{"size":100,'* ]] && awk -v n="${throttled:-0}" 'BEGIN {exit !(n > 0)}'; then
		pass "$name/host-rate-limit-still-set"
	else
		fail "$name/host-rate-limit-still-set" "slow: $js; volfsd_qos_throttled_requests_total: ${throttled:-none}"
	fi
}

# variants: a volume's view in daemon NAME: read_only, rate limit
volume_is() { # volume_is NAME CHECK VOLUME PATTERN
	local js
	js=$("$DAEMON" ctl --json stats "$3" --control-socket "$WORK/ctl-$1.sock" 2>&1)
	if [[ $js == *$4* ]]; then pass "$2"; else fail "$2" "$3: $js (want $4)"; fi
}

mode_variants() {
	local m=$WORK/vol-data/migr fh=--inode-file-handles=prefer
	mkdir -p "$SHARE/ro" "$SHARE/slow" "$WORK/vol-data"
	"$FSOPS_HOST" pattern write "$SHARE/ro/ro.dat" 1 7
	"$FSOPS_HOST" pattern write "$SHARE/slow/slow.dat" 1 9
	truncate -s 65536 "$SHARE/slow/slow.dat"
	chmod 0777 "$WORK/vol-data"
	# The share is a shared mount, so that the bind mount `ctl attach --bind`
	# makes under it reaches the daemon's own mount namespace.
	mount --bind "$SHARE" "$SHARE" && mount --make-shared "$SHARE"
	local common=(--allowed-dir ro:ro "$fh")
	boot src "$SHARE" --control-socket "$WORK/ctl-src.sock" "${common[@]}" \
		--allowed-dir slow,ops_size=100,ops_refill_time_ms=1000 || return 0
	watch_locks dst "$m/locked"
	sleep "$PRE"
	start_daemon dst "$SHARE" --control-socket "$WORK/ctl-dst.sock" "${common[@]}" --allowed-dir slow
	local out
	if out=$("$DAEMON" ctl attach data --control-socket "$WORK/ctl-dst.sock" 2>&1); then
		pass dst/host-attach-data-before-the-load
	else
		fail dst/host-attach-data-before-the-load "$out"
	fi
	start_qemu dst -incoming defer
	if ! live_migrate src dst; then
		fail src/live-migration "$(mig_error src)"
		show_failure dst
		finish_on src "$m" variants dst
		return 0
	fi
	pass src/live-migration
	collect src
	qemu_quit src
	daemon_exit src src/source-daemon-exit-0
	volume_is dst dst/host-ro-still-read-only ro '"read_only":true'
	volume_is dst dst/host-rate-limit-came-with-the-state slow '"rate_limiter":{"ops":{"size":100,'
	guest_goes_on dst "$m"
	snapshot dst "$m" || { finish_on dst "$m" variants; return 0; }
	collect dst
	# A daemon without data: the load must fail naming it.
	if restore nodata "$SHARE" --control-socket "$WORK/ctl-nodata.sock" "${common[@]}" --allowed-dir slow; then
		fail nodata/restore-refused "the restore succeeded though data is not attached"
		qemu_quit nodata
	else
		refused nodata nodata/restore-refused-naming-the-volume '"data"'
	fi
	start_daemon restored "$SHARE" --control-socket "$WORK/ctl-restored.sock" "${common[@]}" --allowed-dir slow
	if out=$("$DAEMON" ctl attach data --control-socket "$WORK/ctl-restored.sock" 2>&1); then
		pass restored/host-attach-data-before-the-load
	else
		fail restored/host-attach-data-before-the-load "$out"
	fi
	if ! load_snapshot restored; then
		fail restored/restore "the restore failed"
		show_failure restored
		return 0
	fi
	pass restored/restore
	watch_locks restored "$m/locked"
	guest_goes_on restored "$m"
	sleep "$POST"
	finish_on restored "$m" variants
}

# ---------------------------------------------------------------- main

trap cleanup EXIT
trap 'exit 130' INT TERM
trap 'say "command failed (status $?) at line $LINENO: $BASH_COMMAND"' ERR
command -v qemu-system-x86_64 >/dev/null || die "no qemu-system-x86_64 (tests/install-deps.sh installs QEMU 10)"
QEMU_VERSION=$(qemu-system-x86_64 --version | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p')
[[ ${QEMU_VERSION%%.*} -ge 10 ]] || die "QEMU $QEMU_VERSION: the migration suites need QEMU 10 (tests/install-deps.sh)"
"$HERE/build-guest.sh" --quiet >/dev/null
mkdir -p "$LOG_DIR"
rm -f "$LOG_DIR"/*.log "$LOG_DIR"/*.json
WORK=$(mktemp -d /var/tmp/volfsd-migration.XXXXXX)
SHARE=$WORK/share
mkdir "$SHARE"
FSOPS_HOST=$WORK/fsops-host
gcc -O2 -Wall -o "$FSOPS_HOST" "$HERE/guest/fsops.c"
CACHE=$(cache_mode)
say "mode $MODE: daemon $DAEMON${DAEMON_ARGS:+ $DAEMON_ARGS}, QEMU $QEMU_VERSION, cache=$CACHE, logs in $LOG_DIR"
case $MODE in
clone) mode_snapshot ;; # the snapshot mode's restore, then the clones
*) "mode_$MODE" ;;
esac
say "mode $MODE took $(echo "$(date +%s.%N) - $T_START" | bc | cut -d. -f1) s"
FINISHED=1
echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]] || exit 1
