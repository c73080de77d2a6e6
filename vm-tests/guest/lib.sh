# Shared helpers for guest suites (busybox sh). Sourced as /lib/vmtest.sh.
#
# Each check runs in a subshell with `set -e`; it passes if the subshell exits
# 0. Helpers below exit non-zero with a message on stderr; the last lines of
# the check's output become the failure reason.

M=/mnt                 # the virtio-fs mount
SYNC=$M/.sync          # host-hook handshake directory
SYNC_TIMEOUT=${SYNC_TIMEOUT:-60}
_req_seq=0

now() { fsops now; }

# run NAME FUNC [ARGS...]
run() {
	_name=$1
	shift
	_t0=$(now)
	_out=$( (set -e; "$@") 2>&1)
	_rc=$?
	_t1=$(now)
	if [ $_rc = 0 ]; then
		echo "VMTEST PASS $_name"
	else
		_why=$(printf '%s\n' "$_out" | tail -n 4 | tr '\n' ' ' | cut -c1-400)
		echo "VMTEST FAIL $_name: ${_why:-exit status $_rc}"
	fi
	echo "VMTEST INFO time $_name $(awk "BEGIN {printf \"%.1f\", $_t1 - $_t0}")s"
}

die() { echo "$*" >&2; exit 1; }

# info TEXT: an informational line on the console, even from inside a check
# (whose own output is captured).
info() { echo "VMTEST INFO $*" >/dev/console; }

# eq WHAT GOT WANT
eq() { [ "$2" = "$3" ] || die "$1: got '$2', want '$3'"; }

# ne WHAT GOT UNWANTED
ne() { [ "$2" != "$3" ] || die "$1: got '$2', which it must not be"; }

# fails CMD...: the command must fail
fails() { if "$@" >/dev/null 2>&1; then die "unexpectedly succeeded: $*"; fi; }

# errno WANT CMD...: an fsops subcommand must end with errno WANT (or OK)
errno() {
	_want=$1
	shift
	_got=$(fsops -e "$@")
	[ "$_got" = "$_want" ] || die "fsops $*: got $_got, want $_want"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

size() { stat -c %s "$1"; }

# host ACTION ARGS...: ask the host hook to do something in the shared dir
# and print its reply. The request file is written under a temporary name
# and renamed, so the hook never sees half a request; the hook answers the
# same way with ack-N. Replies start with "ok" or "fail".
host() {
	_req_seq=$((_req_seq + 1))
	_n=$$-$_req_seq
	mkdir -p "$SYNC"
	echo "$*" >"$SYNC/.req-$_n.tmp"
	mv "$SYNC/.req-$_n.tmp" "$SYNC/req-$_n"
	_deadline=$(($(date +%s) + SYNC_TIMEOUT))
	while [ ! -e "$SYNC/ack-$_n" ]; do
		[ "$(date +%s)" -lt $_deadline ] || die "host hook did not answer '$*' within ${SYNC_TIMEOUT}s"
		usleep 10000
	done
	cat "$SYNC/ack-$_n"
	rm -f "$SYNC/req-$_n" "$SYNC/ack-$_n"
}

# host_ok ACTION ARGS...: like host, but the reply must be "ok"
host_ok() {
	_reply=$(host "$@")
	[ "$_reply" = ok ] || die "host $*: $_reply"
}

# For suites whose mount root is not writable (no .sync directory there): a
# second channel over the serial console. host_step STEP prints
# "VMTEST SYNC STEP" on the console; the suite's host hook
# (vm-tests/suites/NAME.hook.sh, given the serial log) acts on it. The guest
# then waits for the effect with wait_until.
host_step() { echo "VMTEST SYNC $*" >/dev/console; }

# wait_until SECS CMD...: run CMD every 0.1 s until it succeeds; fail after SECS
wait_until() {
	_secs=$1
	shift
	_deadline=$(($(date +%s) + _secs))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt $_deadline ] || die "waited ${_secs}s for: $*"
		usleep 100000
	done
}

# backend_lacks FEATURE: true if the backend under the share (VMTEST_BACKEND,
# from the kernel command line; empty for a local directory) is known to lack
# FEATURE: a "BACKEND FEATURE" line of /lib/backend-gaps (vm-tests/guest/
# backend-gaps, where each feature is described).
backend_lacks() {
	[ -n "${VMTEST_BACKEND:-}" ] && grep -qx "$VMTEST_BACKEND $1" /lib/backend-gaps
}

# Two sandboxes on one volume (suites pair-a.sh and pair-b.sh, run side by side
# by vm-tests/run-pair.sh, each VM with its own volfsd): they meet through marker
# files in the volume's .pair directory. The read-write side (a) writes its own
# markers; the read-only side (b) cannot, so it prints "VMTEST SYNC mark NAME"
# and its host hook (pair-b.hook.sh) writes the marker on the host.
PAIR_VOL=$M/vol
PAIR_DIR=$PAIR_VOL/.pair
PAIR_BROKEN=/tmp/pair-broken

# pair_mark NAME [CONTENT]: make marker NAME (a-... from side a, b-... from b)
pair_mark() {
	case "$1" in
	a-*)
		printf '%s\n' "${2:-}" >"$PAIR_DIR/.$1.tmp"
		mv "$PAIR_DIR/.$1.tmp" "$PAIR_DIR/$1"
		;;
	*) host_step "mark $1" ;;
	esac
}

# pair_await NAME [SECS]: wait for the other side's marker NAME (60 s by
# default). Once a wait has timed out on either side the pair is out of step:
# that side marks SIDE-broken, and every later wait on both sides fails at once
# instead of adding its own timeout.
pair_await() {
	case "$1" in a-*) _me=b ;; *) _me=a ;; esac
	_deadline=$(($(date +%s) + ${2:-60}))
	until [ -e "$PAIR_DIR/$1" ]; do
		if [ -e $PAIR_BROKEN ] || [ -e "$PAIR_DIR/a-broken" ] || [ -e "$PAIR_DIR/b-broken" ]; then
			die "the pair is out of step (a wait timed out); not waiting for $1"
		fi
		if [ "$(date +%s)" -ge $_deadline ]; then
			: >$PAIR_BROKEN
			pair_mark $_me-broken
			die "the other sandbox never reached '$1' within ${2:-60}s"
		fi
		usleep 50000
	done
}

# bg NAME CMD...: CMD in the background, its output in $T/NAME.out and, once it
# ends, its exit status in $T/NAME.rc (the suites' holders and loops).
bg() {
	_n=$1
	shift
	(
		"$@"
		echo $? >"$T/$_n.rc"
	) >"$T/$_n.out" 2>&1 </dev/null &
}

# fio_verify_loop NAME: fio random writes with crc32c verify on $W/fio, run after
# run until $STOP exists; the first run that fails or reports an error ends it
# (exit 1, saying which run and why), else it prints "runs N".
fio_verify_loop() {
	n=0
	while [ ! -e "$STOP" ]; do
		n=$((n + 1))
		fio --name="$1" --directory="$W/fio" --size=4M --bs=4k --rw=randwrite \
			--ioengine=psync --verify=crc32c --verify_fatal=1 --do_verify=1 \
			--output="$T/fio-$n.txt" >/dev/null 2>&1 ||
			{ echo "fio run $n failed: $(grep -iE 'err|verify' "$T/fio-$n.txt" | head -n 3 | tr '\n' ' ')"; exit 1; }
		grep -q 'err= 0' "$T/fio-$n.txt" || { echo "fio run $n: $(grep -E 'err=' "$T/fio-$n.txt" | head -n 2)"; exit 1; }
	done
	echo "runs $n"
}
