# Guest side of the upgrade suite (issue 26, docs/UPGRADE.md): volfsd runs with
# --upgradable and the host upgrades it again and again (upgrade.hook.sh) while
# this guest works; the guest never learns when. It sets up its work dir (the
# volume upg, SHARE/upg on the host), starts its workload, prints "VMTEST SYNC workload-running", and
# goes on until the host writes WORK/stop. Held throughout:
#   fio/       fio with verify=crc32c, run after run (4 MiB random writes, then
#              the verify) until the stop; a run that fails ends the loop
#   meta/      a metadata loop: create, write, rename, stat, read back, unlink,
#              mkdir, stat, rmdir, round after round; every failed step is
#              counted (and the first ones printed); meta/progress (written
#              and renamed in each round) shows the host that the guest goes on
#   locked     a POSIX write lock and an flock (fsops lockhold); another guest
#              process is refused both before and after; the host tries them
#              every few ms throughout (fsops lockwatch) and must never get one
# After the stop: 0 errors in the loops, fio's verify passed in every run, the
# locks still held, ordinary operations work, then "VMTEST SYNC release-locks"
# (the host stops its lock watcher and answers in .acks/release-locks), and the
# locks go.
# shellcheck disable=SC1091 # the guest's copy of guest/lib.sh
. /lib/vmtest.sh

W=$M/upg
STOP=$W/stop
T=/tmp/upgrade
mkdir -p "$T"

t_setup() {
	rm -rf "${W:?}"/*
	mkdir -p "$W/fio" "$W/meta"
	echo "lock me" >"$W/locked"
}

# step WHAT CMD...: one step of the metadata loop; a failure is counted
step() {
	_what=$1
	shift
	"$@" >/dev/null 2>"$T/meta-step.err" && return 0
	errs=$((errs + 1))
	[ $errs -gt 5 ] || echo "round $n: $_what failed: $(head -c 200 "$T/meta-step.err")"
}

meta_loop() {
	n=0 errs=0 slow=0
	d=$W/meta
	while [ ! -e "$STOP" ]; do
		n=$((n + 1))
		t0=$(now)
		step create sh -c "echo $n >$d/f.$n"
		step rename mv "$d/f.$n" "$d/g.$n"
		step stat stat "$d/g.$n"
		step read-back test "$(cat "$d/g.$n" 2>/dev/null)" = "$n"
		step old-name-gone test ! -e "$d/f.$n"
		step unlink rm "$d/g.$n"
		step mkdir mkdir "$d/d.$n"
		step stat-dir test -d "$d/d.$n"
		step rmdir rmdir "$d/d.$n"
		step progress sh -c "echo $n >$d/.progress.tmp && mv $d/.progress.tmp $d/progress"
		t=$(awk "BEGIN {printf \"%d\", ($(now) - $t0) * 1000}")
		[ "$t" -le "$slow" ] || slow=$t
	done
	echo "rounds $n errors $errs slowest-round-ms $slow"
}

t_start_workload() {
	# Not in bg: its pid is the one to kill when the locks may go.
	fsops lockhold "$W/locked" >"$T/lock.out" 2>&1 </dev/null &
	echo $! >"$T/lock.pid"
	wait_until 20 grep -q locked "$T/lock.out"
	errno EAGAIN trylock posix "$W/locked"
	errno EAGAIN trylock flock "$W/locked"
	bg fio fio_verify_loop upg
	bg meta meta_loop
	wait_until 20 test -e "$W/meta/progress"
}

# ended NAME: the holder has exited with status 0 (waits up to 120 s: fio
# finishes its run)
ended() {
	_d=$(($(date +%s) + 120))
	until [ -e "$T/$1.rc" ]; do
		[ "$(date +%s)" -lt $_d ] || die "$1 still running 120 s after the stop: $(tail -n 3 "$T/$1.out" | tr '\n' ' ')"
		usleep 100000
	done
	eq "$1 exit status (output: $(tail -n 3 "$T/$1.out" | tr '\n' ' '))" "$(cat "$T/$1.rc")" 0
}

t_meta() {
	ended meta
	info "upgrade: metadata loop: $(tail -n 1 "$T/meta.out")"
	grep -q '^rounds [1-9][0-9]* errors 0 ' "$T/meta.out" || die "$(tail -n 6 "$T/meta.out" | tr '\n' ' ')"
	eq "entries left in meta/" "$(fsops readdir -l "$W/meta" | grep -cv '^progress$')" 0
}

t_fio() {
	ended fio
	info "upgrade: fio verify $(cat "$T/fio.out")"
	grep -q '^runs [1-9]' "$T/fio.out" || die "$(cat "$T/fio.out")"
}

t_locks() {
	kill -0 "$(cat "$T/lock.pid")" 2>/dev/null || die "the lock holder exited: $(cat "$T/lock.out")"
	errno EAGAIN trylock posix "$W/locked"
	errno EAGAIN trylock flock "$W/locked"
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
	ln "$W/sub/g" "$W/sub/h"
	eq nlink "$(stat -c %h "$W/sub/g")" 2
	rm "$W/sub/g" "$W/sub/h"
	rmdir "$W/sub"
	fsops readdir -l "$W" | grep -qx stop || die "the host's stop file is not listed"
	cat "$STOP" >"$W/after-upgrades"
}

t_release_locks() {
	host_step release-locks
	wait_until 60 test -e "$W/.acks/release-locks"
	eq "host's answer" "$(cat "$W/.acks/release-locks")" ok
}

t_locks_released() {
	kill "$(cat "$T/lock.pid")"
	wait_until 10 fsops trylock posix "$W/locked"
	wait_until 10 fsops trylock flock "$W/locked"
}

run setup t_setup
run start-workload t_start_workload
host_step workload-running
# The host upgrades the daemon meanwhile, then writes the stop file.
_i=0
while [ ! -e "$STOP" ] && [ $_i -lt 9000 ]; do
	usleep 100000
	_i=$((_i + 1))
done
[ -e "$STOP" ] || echo "VMTEST FAIL stop: no stop file from the host in 900 s"
info "upgrade: stop file says '$(cat "$STOP")'"
run metadata-loop-no-errors t_meta
run fio-verify t_fio
run locks-held-in-guest t_locks
run kernel-log-clean t_kernel_log
run ops-after-upgrades t_ops
run host-released-lock-watch t_release_locks
run locks-released t_locks_released
sync
