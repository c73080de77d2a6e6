# Guest side of the reboot suite: a guest that reboots without unmounting
# (`reboot -f`) must get a clean session from the same daemon. Runs across
# two boots of one VM (run-vm.sh --allow-reboot); SHARE/reboot/phase tells
# them apart.
#   boot 1: create a file, a background process takes a POSIX write lock
#     (fcntl F_SETLK) and an flock on it; the host (reboot.hook.sh, step
#     locks-held) must see both held; write phase=1; reboot -f.
#   boot 2: the share mounts again; the host (step check-free) must see both
#     locks free, before this guest touches the file; the guest can take both;
#     ordinary file operations work; write phase=2; power off as usual.
# The hook answers each step with SHARE/reboot/.acks/STEP ("ok" or "fail: ...")
# and records its own PASS/FAIL lines, which reboot.host.sh reports.
. /lib/vmtest.sh

WAIT=${WAIT:-60}
R=$M/reboot
F=$R/locked-file
PHASE=$R/phase

# wait_ack STEP: the hook's answer to STEP must be "ok"
wait_ack() {
	wait_until "$WAIT" test -e "$R/.acks/$1"
	_r=$(cat "$R/.acks/$1")
	[ "$_r" = ok ] || die "host step $1: $_r"
}

# ---------------------------------------------------------------- boot 1

t_create() {
	mkdir -p "$R"
	echo "written in boot 1" >"$F"
	eq content "$(cat "$F")" "written in boot 1"
}

t_hold_locks() {
	# Outlives this check (it holds the locks until the reboot); its output
	# must not go to the check's captured stdout.
	fsops lockhold "$F" >/tmp/lockhold.out 2>&1 </dev/null &
	echo $! >/tmp/lockhold.pid
	wait_until 30 grep -qx locked /tmp/lockhold.out || die "lockhold: $(cat /tmp/lockhold.out)"
	# Another guest process must be refused both: the daemon holds them.
	errno EAGAIN trylock posix "$F"
	errno EAGAIN trylock flock "$F"
}

t_host_sees_held() {
	host_step locks-held
	wait_ack locks-held
}

boot1() {
	info "reboot suite: boot 1"
	run create-file t_create
	run hold-locks t_hold_locks
	echo 1 >"$PHASE"
	run host-sees-locks-held t_host_sees_held
	kill -0 "$(cat /tmp/lockhold.pid)" || echo "VMTEST FAIL lock-holder-alive: the lock holder exited before the reboot"
	info "reboot suite: reboot -f with the locks held"
	sync
	reboot -f
	sleep 120
	echo "VMTEST FAIL reboot: reboot -f returned and the guest still runs after 120s"
}

# ---------------------------------------------------------------- boot 2

t_mount_after_reboot() {
	grep -q "^share /mnt virtiofs " /proc/mounts || die "/mnt is not a virtiofs mount: $(grep ' /mnt ' /proc/mounts)"
	eq "phase marker" "$(cat "$PHASE")" 1
	eq "boot 1's file" "$(cat "$F")" "written in boot 1"
}

# First of boot 2, before the guest takes any lock on the file itself.
t_host_sees_free() {
	host_step check-free
	wait_ack check-free
}

t_guest_posix_lock() { errno OK trylock posix "$F"; }
t_guest_flock() { errno OK trylock flock "$F"; }

t_serving() {
	echo "written in boot 2" >"$R/new"
	eq "new file" "$(cat "$R/new")" "written in boot 2"
	echo "appended in boot 2" >>"$F"
	eq "appended" "$(tail -n 1 "$F")" "appended in boot 2"
	mkdir "$R/dir"
	mv "$R/new" "$R/dir/moved"
	eq "ls dir" "$(ls "$R/dir")" moved
	eq "readdir" "$(fsops readdir "$R")" 4 # .acks dir locked-file phase
	rm "$R/dir/moved"
	rmdir "$R/dir"
	errno ENOENT stat "$R/dir"
}

boot2() {
	info "reboot suite: boot 2"
	run mount-after-reboot t_mount_after_reboot
	run host-sees-locks-free-after-reboot t_host_sees_free
	run guest-posix-lock-after-reboot t_guest_posix_lock
	run guest-flock-after-reboot t_guest_flock
	run daemon-serves-after-reboot t_serving
	echo 2 >"$PHASE"
}

case "$(cat "$PHASE" 2>/dev/null)" in
"") boot1 ;;
1) boot2 ;;
*) echo "VMTEST FAIL reboot-phase: unexpected boot: $PHASE holds '$(cat "$PHASE")'" ;;
esac
