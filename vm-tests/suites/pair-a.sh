# Guest suite of sandbox A, the read-write side of two sandboxes on one volume
# (vm-tests/run-pair.sh boots A and B at once, each with its own volfsd; B is
# read-only on the same host directory). /mnt/vol is the volume. The two meet
# through marker files (pair_mark / pair_await in /lib/vmtest.sh); pair-b.sh
# holds the checks, this side makes the changes B must see.
# The suite ends with A's VM killed while it holds locks: it prints VMTEST DONE
# itself first, then asks its host hook (pair-a.hook.sh) for the kill.
. /lib/vmtest.sh

V=$PAIR_VOL
X_SIZE=65536

fill() { # fill FILE CHAR: X_SIZE bytes of CHAR
	head -c $X_SIZE /dev/zero | tr '\0' "$2" >"$1"
}

# hold KIND FILE OUT: a lockhold in the background, its pid in OUT.pid, once held
hold() {
	fsops lockhold "$2" "$1" >"$3" 2>&1 </dev/null &
	echo $! >"$3.pid"
	wait_until 30 grep -qx locked "$3" || die "lockhold $1 $2: $(cat "$3")"
}

t_meet() {
	[ -d "$PAIR_DIR" ] || die "no $PAIR_DIR: the runner makes it before the VMs boot"
	printf 'round-0\n' >"$V/seen"
	fill "$V/x" a
	for f in lk-posix lk-ofd lk-wait lk-kill; do : >"$V/$f"; done
	head -c 4096 /dev/zero | tr '\0' . >"$V/mm"
	pair_mark a-up
	pair_await b-up 600
}

# In place (same inode, same size): a reader that cached the old content would
# keep seeing it.
t_writes_seen() {
	pair_await b-read-round0
	for i in 1 2 3; do
		fsops pwrite "$V/seen" 0 "round-$i"
		pair_mark a-round$i
		pair_await b-round$i
	done
	head -c 1048576 /dev/urandom >"$V/big"
	pair_mark a-big "$(sha "$V/big")"
	pair_await b-big
}

t_rename_over() {
	pair_await b-reading
	n=0
	while [ $n -lt 200 ]; do
		n=$((n + 1))
		if [ $((n % 2)) = 1 ]; then c=b; else c=a; fi
		fill "$V/x.tmp" $c
		mv "$V/x.tmp" "$V/x"
	done
	pair_mark a-renamed $n
	pair_await b-renames-checked 120
}

t_locks_held() {
	hold posix "$V/lk-posix" /tmp/h-posix
	hold ofd "$V/lk-ofd" /tmp/h-ofd
	pair_mark a-locked
	pair_await b-checked-locks
	kill "$(cat /tmp/h-posix.pid)" "$(cat /tmp/h-ofd.pid)"
}

t_unlock_wakes_waiters() {
	hold posix "$V/lk-wait" /tmp/h-wait
	pair_mark a-locked-wait
	pair_await b-waiting
	sleep 1
	kill "$(cat /tmp/h-wait.pid)"
	wait "$(cat /tmp/h-wait.pid)" 2>/dev/null || true
	pair_mark a-unlocked
	pair_await b-woke
}

t_mmap_shared_write() {
	rm -f /tmp/msync-now
	fsops mmap write "$V/mm" 0 mapped-by-A wait:/tmp/msync-now >/tmp/mm.out 2>&1 &
	pid=$!
	wait_until 30 grep -qx mapped /tmp/mm.out || die "mmap write: $(cat /tmp/mm.out)"
	pair_mark a-mapped
	pair_await b-looked
	: >/tmp/msync-now
	wait $pid || die "mmap write: $(cat /tmp/mm.out)"
	pair_mark a-msynced
	pair_await b-mmap-checked
}

run meet t_meet
run writes-seen t_writes_seen
run rename-over t_rename_over
run locks-held t_locks_held
run unlock-wakes-waiters t_unlock_wakes_waiters
run mmap-shared-write t_mmap_shared_write

# Last: A holds a POSIX lock and an flock when its VM is killed. B checks that
# both are released (pair-b.sh, t_kill_releases_locks), and run-vm.sh that A's
# volfsd exits 0 once its QEMU is gone.
hold_for_kill() {
	hold posix "$V/lk-kill" /tmp/h-kill
	pair_mark a-holding
	pair_await b-waiting-kill 120
}
run hold-locks-until-killed hold_for_kill
echo "VMTEST DONE"
host_step kill-vmm
sleep 600
echo "VMTEST FAIL kill-vmm: the VM was not killed within 600 s"
