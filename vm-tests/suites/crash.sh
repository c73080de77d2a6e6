# Guest side of the crash suite (issue 26, docs/UPGRADE.md): the host kills the
# daemon's serving process again and again (crash.hook.sh) while this guest works;
# the guest never learns when. It sets up its work dir (SHARE/crash), starts its
# workload, prints "VMTEST SYNC workload-running", and goes on until the host
# writes WORK/stop. Held throughout:
#   fio/       fio with verify=crc32c, run after run (4 MiB random writes at
#              explicit offsets, then the verify, on a file laid out before the
#              first kill) until the stop; a run that fails ends the loop
#   meta/      fsops metaloop: an exclusive create, write, rename, stat, read back,
#              unlink, mkdir, rmdir, round after round; it counts the EIOs (a
#              request in flight at a kill that is not idempotent), EEXIST on its
#              own exclusive create (a create run twice: must be 0) and any other
#              failure (must be 0); meta/progress shows the host it goes on
#   durable    fsops durable: record after record written with pwrite and fsynced;
#              the last one fsync confirmed is kept outside the share, and the
#              host checks every one of them is in the file (crash.host.sh)
# After the stop: the counts, fio's verify in every run, ordinary operations work,
# and the guest's EIO total goes to crash/guest-eio for the host to compare with
# the daemon's count of requests it failed.
# shellcheck disable=SC1091 # the guest's copy of guest/lib.sh
. /lib/vmtest.sh

W=$M/crash
STOP=$W/stop
T=/tmp/crash
mkdir -p "$T"

t_setup() {
	rm -rf "${W:?}"/*
	mkdir -p "$W/fio" "$W/meta"
	# Laid out now: a kill during fio's layout would fail its FALLOCATE (EIO),
	# which is no write at an offset.
	fio --name=crash --directory="$W/fio" --size=4M --bs=4k --rw=randwrite \
		--ioengine=psync --create_only=1 --output="$T/fio-layout.txt" >/dev/null 2>&1 ||
		die "fio layout: $(tail -n 3 "$T/fio-layout.txt")"
}

# Lines to the console while tasks are blocked in D state for long (what a guest
# sees of a daemon that never comes back: virtiofsd's run of this suite).
blocked_monitor() {
	[ -w /proc/sys/kernel/hung_task_timeout_secs ] && echo 10 >/proc/sys/kernel/hung_task_timeout_secs
	_since=0
	while [ ! -e "$T/monitor.stop" ]; do
		_d=$(grep -l '^State:.*D (disk sleep)' /proc/[0-9]*/status 2>/dev/null | wc -l)
		if [ "$_d" -gt 0 ]; then
			_since=$((_since + 1))
			[ $((_since % 10)) = 0 ] && echo "VMTEST INFO crash-monitor: $_d tasks blocked in D state for ${_since} s" >/dev/console
		else
			_since=0
		fi
		sleep 1
	done
}

t_start_workload() {
	(blocked_monitor) >/dev/null 2>&1 </dev/null &
	bg fio fio_verify_loop crash
	bg meta fsops metaloop "$W/meta" "$STOP"
	bg durable fsops durable "$W/durable" "$STOP" "$T/durable.done"
	wait_until 30 test -e "$W/meta/progress"
	wait_until 30 test -s "$T/durable.done"
}

ended() { # ended NAME: the holder exited 0 (waits up to 180 s: fio ends its run)
	_d=$(($(date +%s) + 180))
	until [ -e "$T/$1.rc" ]; do
		[ "$(date +%s)" -lt $_d ] || die "$1 still running 180 s after the stop: $(tail -n 3 "$T/$1.out" | tr '\n' ' ')"
		usleep 100000
	done
	eq "$1 exit status (output: $(tail -n 3 "$T/$1.out" | tr '\n' ' '))" "$(cat "$T/$1.rc")" 0
}

# field NAME FILE: the number after NAME in the summary line (last line) of FILE
field() { tail -n 1 "$2" | awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'; }

t_meta() {
	ended meta
	info "crash: metadata loop: $(tail -n 1 "$T/meta.out")"
	[ "$(field rounds "$T/meta.out")" -gt 0 ] || die "no rounds: $(cat "$T/meta.out")"
	eq "EEXIST on its own exclusive create (run twice)" "$(field eexist "$T/meta.out")" 0
	eq "unexpected failures ($(head -n 5 "$T/meta.out" | tr '\n' ' '))" "$(field unexpected "$T/meta.out")" 0
	eq "entries left in meta/" "$(fsops readdir -l "$W/meta" | grep -cv '^progress$')" 0
}

t_fio() {
	ended fio
	info "crash: fio verify $(cat "$T/fio.out")"
	grep -q '^runs [1-9]' "$T/fio.out" || die "$(cat "$T/fio.out")"
}

t_durable() {
	ended durable
	info "crash: durable records: $(tail -n 1 "$T/durable.out")"
	eq "other failures ($(head -n 5 "$T/durable.out" | tr '\n' ' '))" "$(field other "$T/durable.out")" 0
	cp "$T/durable.done" "$W/durable.done"
}

t_guest_eio() {
	_e=$(($(field eio "$T/meta.out") + $(field eio "$T/durable.out")))
	info "crash: EIO the guest got in all: $_e"
	echo "$_e" >"$W/guest-eio"
}

# The guest's kernel saw no virtio-fs or FUSE trouble, and no task hung.
t_kernel_log() {
	_bad=$(dmesg | grep -iE 'virtio|fuse|hung|blocked for more than' | grep -iE 'err|fail|timeout|hung|blocked' || true)
	[ -z "$_bad" ] || die "$(echo "$_bad" | head -n 3 | tr '\n' ' ')"
}

t_ops() {
	mkdir "$W/sub"
	echo hello >"$W/sub/f"
	mv "$W/sub/f" "$W/sub/g"
	eq content "$(cat "$W/sub/g")" hello
	rm "$W/sub/g"
	rmdir "$W/sub"
	cat "$STOP" >"$W/after-crashes"
}

run setup t_setup
run start-workload t_start_workload
host_step workload-running
# The host kills the daemon's serving process meanwhile, then writes the stop file.
_i=0
while [ ! -e "$STOP" ] && [ $_i -lt 9000 ]; do
	usleep 100000
	_i=$((_i + 1))
done
[ -e "$STOP" ] || echo "VMTEST FAIL stop: no stop file from the host in 900 s"
info "crash: stop file says '$(cat "$STOP")'"
run metadata-loop-no-double-apply t_meta
run fio-verify t_fio
run durable-no-failures t_durable
run guest-eio-counted t_guest_eio
run kernel-log-clean t_kernel_log
run ops-after-crashes t_ops
: >"$T/monitor.stop"
sync
