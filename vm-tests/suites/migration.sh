# Guest side of the migration suites (vm-tests/run-migration.sh): a workload
# that keeps the share busy while the host moves the VM, live or through a
# snapshot file, maybe into a copy of the share. The guest never learns when it
# moves: it sets everything up, prints "VMTEST SYNC workload-running", and goes
# on until the host writes WORK/stop (its content names the VM that finishes:
# live, original, clone1, ...). Then each holder reports and the checks run.
#
# Held across the move, in WORK (SHARE/migr; in the variants mode
# /mnt/data/migr, data being a volume the host attaches at runtime):
#   append.log   one fd open for appending (exec 3>>), a numbered line every
#                100 ms; after the stop "end NAME" through the same fd
#   read.dat     one fd open for reading (fsops readhold: 4 KiB every 50 ms,
#                each checked against its pattern)
#   dir/         300 files, a directory fd in the middle of its readdir
#                (fsops dirhold: 40 entries read before, the rest after)
#   cwd/         a process whose working directory it is, using relative paths
#                after the move
#   locked       a POSIX write lock and an flock (fsops lockhold); the host
#                tries them every few ms (run-migration.sh) and must be refused
#   mapped       a shared map written and msynced every 100 ms (fsops mmaphold)
#   fio/         fio with verify=crc32c, run after run until the stop
#   victim1/2    an fd each (fsops holdio); the gone mode deletes them on the
#                host: victim1 between snapshot and restore (guest-error: only
#                that fd fails, EIO or ESTALE), victim2 before a live migration
#                that must abort (the source runs on, the fd keeps working)
# The variants mode also holds a file of the read-only volume ro and of the
# rate-limited volume slow open for reading, and checks after the move that ro
# still refuses writes and that slow still answers (the host checks that its
# limit still holds, from the destination daemon's metrics).
#
# The cloud-hypervisor modes (vm-tests/run-ch-migration.sh) keep the work dir in
# the volume data, given on the daemon's command line (/mnt/data/migr): chdata;
# chro also holds a file of the read-only, rate-limited volume rolim, which the
# host attaches through the control socket when the guest asks (VMTEST SYNC
# attach-rolim), and checks after the move that rolim still refuses writes and
# still serves (the host checks its limit in the daemon).
#
# After the checks the guest prints "VMTEST SYNC release-locks" and waits for
# WORK/.acks/release-locks (the host has stopped trying the locks), then lets
# the locks go.
# Kernel command line: vmtest.migration=live|snapshot|clone|gone|variants|chdata|chro
# shellcheck disable=SC1091 # the guest's copy of guest/lib.sh
. /lib/vmtest.sh

MODE=live
# shellcheck disable=SC2013 # the command line is words
for _a in $(cat /proc/cmdline); do
	case "$_a" in vmtest.migration=*) MODE=${_a#vmtest.migration=} ;; esac
done
W=$M/migr
case $MODE in variants | chdata | chro) W=$M/data/migr ;; esac
STOP=$W/stop
SEED=42
NDIR=300
# Under cloud-hypervisor (nested: each request crosses two emulated levels) a
# smaller directory, still far more than the 40 entries read before the move.
case $MODE in chdata | chro) NDIR=100 ;; esac
T=/tmp/migration
mkdir -p "$T"

# ------------------------------------------------------------ set up

t_attach_data() {
	host_step attach-data
	wait_until 60 test -d "$M/data"
}

t_attach_rolim() {
	host_step attach-rolim
	wait_until 120 test -f "$M/rolim/ro.dat"
}

t_setup() {
	rm -rf "$W"
	mkdir -p "$W/dir" "$W/cwd" "$W/fio"
	fsops pattern write "$W/read.dat" 1 $SEED
	fsops mkfiles "$W/dir" f $NDIR
	echo "lock me" >"$W/locked"
	head -c 4096 /dev/zero >"$W/mapped"
	echo victim1 >"$W/victim1"
	echo victim2 >"$W/victim2"
	: >"$W/append.log"
}

# waitfor FILE TEXT: a holder's output file must get a line starting with TEXT
# (20 s; the failure shows what the holder printed)
waitfor() {
	_d=$(($(date +%s) + 20))
	until grep -q "^$2" "$1" 2>/dev/null; do
		[ "$(date +%s)" -lt $_d ] || die "waited 20s for '$2' in $1: $(tail -n 3 "$1" | tr '\n' ' ')"
		usleep 100000
	done
}

# Every holder runs in the background (bg, /lib/vmtest.sh).
appender() {
	exec 3>>"$W/append.log"
	i=0
	while [ ! -e "$STOP" ]; do
		i=$((i + 1))
		echo "$i" >&3 || echo "append of line $i failed"
		usleep 100000
	done
	echo "end $(cat "$STOP")" >&3 || echo "append of the end line failed"
	exec 3>&-
	echo "lines $i"
}

in_cwd() {
	cd "$W/cwd" || exit 1
	echo before >rel-before.txt
	while [ ! -e ../stop ]; do usleep 100000; done
	echo after >rel-after.txt
	cat rel-before.txt rel-after.txt
	ls
	stat -c '%F' .
}

t_start_workload() {
	bg append appender
	bg read fsops readhold "$W/read.dat" $SEED "$STOP"
	bg dir fsops dirhold "$W/dir" 40 "$STOP"
	bg cwd in_cwd
	# Not in bg: its pid is the one to kill when the locks may go.
	fsops lockhold "$W/locked" >"$T/lock.out" 2>&1 </dev/null &
	echo $! >"$T/lock.pid"
	bg mmap fsops mmaphold "$W/mapped" "$STOP"
	bg victim1 fsops holdio "$W/victim1" "$STOP"
	bg victim2 fsops holdio "$W/victim2" "$STOP"
	bg fio fio_verify_loop mig
	if [ "$MODE" = variants ]; then
		bg ro fsops readhold "$M/ro/ro.dat" 7 "$STOP"
		bg slow fsops readhold "$M/slow/slow.dat" 9 "$STOP"
		waitfor "$T/ro.out" open
		waitfor "$T/slow.out" open
	fi
	if [ "$MODE" = chro ]; then
		bg rolim fsops readhold "$M/rolim/ro.dat" 7 "$STOP"
		waitfor "$T/rolim.out" open
	fi
	waitfor "$T/read.out" open
	waitfor "$T/dir.out" held
	waitfor "$T/lock.out" locked
	waitfor "$T/mmap.out" mapped
	waitfor "$T/victim1.out" open
	waitfor "$T/victim2.out" open
	wait_until 10 grep -q . "$W/append.log"
	# Another guest process is refused both locks: the daemon holds them.
	errno EAGAIN trylock posix "$W/locked"
	errno EAGAIN trylock flock "$W/locked"
}

# ------------------------------------------------------------ after the move

# ended NAME [SECONDS]: the holder has exited with status 0 (waits up to SECONDS,
# 60 by default: fio finishes the run it is in, which a nested guest on a busy
# 2-core host has been seen to take over a minute for)
ended() {
	_w=${2:-60}
	_d=$(($(date +%s) + _w))
	until [ -e "$T/$1.rc" ]; do
		[ "$(date +%s)" -lt $_d ] || die "$1 still running $_w s after the stop: $(tail -n 3 "$T/$1.out" | tr '\n' ' ')"
		usleep 100000
	done
	eq "$1 exit status (output: $(tail -n 3 "$T/$1.out" | tr '\n' ' '))" "$(cat "$T/$1.rc")" 0
}

t_append_fd() {
	ended append
	_n=$(sed -n 's/^lines //p' "$T/append.out")
	[ -n "$_n" ] || die "appender: $(cat "$T/append.out")"
	grep -q failed "$T/append.out" && die "$(cat "$T/append.out")"
	info "migration: $_n lines appended through one fd"
	eq "append.log lines" "$(wc -l <"$W/append.log")" $((_n + 1))
	awk -v n="$_n" 'NR <= n && $1 != NR {print "line " NR " is \"" $0 "\""; exit 1}' "$W/append.log" >&2
	eq "last line" "$(tail -n 1 "$W/append.log")" "end $(cat "$STOP")"
}

t_read_fd() {
	ended read
	grep -q '^reads [0-9]* bytes [0-9]*$' "$T/read.out" || die "readhold: $(cat "$T/read.out")"
	info "migration: read fd: $(tail -n 1 "$T/read.out")"
}

t_readdir() {
	ended dir
	eq "entries read through the held directory fd" "$(tail -n 1 "$T/dir.out")" "entries $NDIR dups 0"
	eq "fresh listing" "$(fsops readdir "$W/dir")" $NDIR
}

t_cwd() {
	ended cwd
	eq "relative reads" "$(sed -n 1,2p "$T/cwd.out" | tr '\n' ' ')" "before after "
	grep -qx rel-after.txt "$T/cwd.out" || die "ls in cwd: $(cat "$T/cwd.out")"
	eq "rel-after.txt by full path" "$(cat "$W/cwd/rel-after.txt")" after
}

t_locks() {
	kill -0 "$(cat "$T/lock.pid")" 2>/dev/null || die "the lock holder exited: $(cat "$T/lock.out")"
	errno EAGAIN trylock posix "$W/locked"
	errno EAGAIN trylock flock "$W/locked"
}

t_mmap() {
	ended mmap
	_t=$(sed -n 's/^ticks //p' "$T/mmap.out")
	[ -n "$_t" ] || die "mmaphold: $(cat "$T/mmap.out")"
	eq "before" "$(dd if="$W/mapped" bs=1 count=11 2>/dev/null)" before-move
	eq "last tick" "$(dd if="$W/mapped" bs=1 skip=64 count=13 2>/dev/null)" "$(printf 'tick %08d' "$_t")"
	eq "after" "$(dd if="$W/mapped" bs=1 skip=128 count=10 2>/dev/null)" after-move
	info "migration: shared map written $_t times"
}

t_fio() {
	ended fio 240
	info "migration: fio verify $(cat "$T/fio.out")"
	grep -q '^runs [1-9]' "$T/fio.out" || die "$(cat "$T/fio.out")"
}

# victim NAME WANT: WANT is ok or gone (EIO or ESTALE for both read and write)
victim() {
	ended "$1"
	_got=$(tail -n 1 "$T/$1.out")
	info "migration: $1: $_got"
	case "$2:$_got" in
	ok:"read=OK write=OK") ;;
	gone:"read=EIO write=EIO" | gone:"read=ESTALE write=ESTALE") ;;
	*) die "$1 ($2): $_got" ;;
	esac
}

t_victims() {
	if [ "$MODE" = gone ]; then
		victim victim1 gone
		# Deleted on the host while the guest ran: the daemon's fd keeps it.
		victim victim2 ok
	else
		victim victim1 ok
		victim victim2 ok
	fi
}

t_ops() {
	mkdir "$W/sub"
	echo hello >"$W/sub/f"
	mv "$W/sub/f" "$W/sub/g"
	eq content "$(cat "$W/sub/g")" hello
	eq "listing" "$(fsops readdir -l "$W/sub")" g
	ln "$W/sub/g" "$W/sub/h"
	eq nlink "$(stat -c %h "$W/sub/g")" 2
	rm "$W/sub/g" "$W/sub/h"
	rmdir "$W/sub"
	cat "$STOP" >"$W/written-by-$(cat "$STOP")"
	fsops readdir -l "$W" | grep -qx stop || die "the host's stop file is not listed"
}

t_ro_volume() {
	ended ro
	info "migration: ro reader: $(tail -n 1 "$T/ro.out")"
	errno EROFS open "$M/ro/new" cx
	errno EROFS open "$M/ro/ro.dat" w
}

t_slow_volume() {
	ended slow
	info "migration: slow reader: $(tail -n 1 "$T/slow.out")"
	_t0=$(now)
	for i in $(seq 1 100); do stat "$M/slow/slow.dat" >/dev/null; done
	info "migration: 100 stats on slow took $(awk "BEGIN {printf \"%.1f\", $(now) - $_t0}")s"
}

t_rolim_volume() {
	ended rolim
	info "migration: rolim reader: $(tail -n 1 "$T/rolim.out")"
	errno EROFS open "$M/rolim/new" cx
	errno EROFS open "$M/rolim/ro.dat" w
	# Limited to 10 operations a second: 30 stats still all answer.
	for i in $(seq 1 30); do stat "$M/rolim/ro.dat" >/dev/null; done
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

info "migration suite: mode $MODE, work dir $W"
if [ "$MODE" = variants ]; then
	run attach-data-at-runtime t_attach_data
fi
if [ "$MODE" = chro ]; then
	run attach-rolim-at-runtime t_attach_rolim
fi
run setup t_setup
run start-workload t_start_workload
host_step workload-running
# The host moves the VM meanwhile, then writes the stop file.
_i=0
while [ ! -e "$STOP" ] && [ $_i -lt 9000 ]; do
	usleep 100000
	_i=$((_i + 1))
done
[ -e "$STOP" ] || echo "VMTEST FAIL stop: no stop file from the host in 900 s"
info "migration: stop file says '$(cat "$STOP")'"
run append-fd-carries-on t_append_fd
run read-fd-intact t_read_fd
run readdir-completes t_readdir
run cwd-on-share t_cwd
run locks-held-in-guest t_locks
run mmap-writes-land t_mmap
run fio-verify t_fio
run held-fds-as-expected t_victims
if [ "$MODE" = variants ]; then
	run ro-volume-stays-ro t_ro_volume
	run slow-volume-serves t_slow_volume
fi
if [ "$MODE" = chro ]; then
	run rolim-volume-stays-ro-and-serves t_rolim_volume
fi
run ops-after-move t_ops
run host-released-lock-watch t_release_locks
run locks-released t_locks_released
sync
