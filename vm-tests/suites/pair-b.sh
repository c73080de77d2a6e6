# Guest suite of sandbox B, the read-only side of two sandboxes on one volume
# (see pair-a.sh). B checks, as it happens, what A does on the same host
# directory through another volfsd: writes seen at once (cache=none), renames
# never torn, B's writes refused, A's locks conflicting with B's (POSIX, OFD,
# flock), a blocked F_SETLKW woken by A's unlock, A's shared mmap writes, and
# A's locks released when A's QEMU is killed.
. /lib/vmtest.sh

V=$PAIR_VOL

t_meet() {
	pair_mark b-up
	pair_await a-up 600
}

t_readonly() {
	errno EROFS open "$V/new" wc
	errno EROFS open "$V/seen" w
	errno EROFS mkdir "$V/d"
	errno EROFS unlink "$V/seen"
	errno EROFS rename2 none "$V/seen" "$V/seen2"
	errno EROFS truncate "$V/seen" 0
	errno EROFS chmod 0600 "$V/seen"
	errno EROFS touch "$V/seen"
	errno EACCES mmap rwmap-rdonly "$V/mm"
}

# B reads the file before each round, so a cached copy would show the old round.
t_writes_seen_at_once() {
	eq "before round 1" "$(cat "$V/seen")" round-0
	pair_mark b-read-round0
	for i in 1 2 3; do
		pair_await a-round$i
		eq "round $i, read at once" "$(cat "$V/seen")" round-$i
		pair_mark b-round$i
	done
	pair_await a-big
	eq "1 MiB written by A" "$(sha "$V/big")" "$(cat "$PAIR_DIR/a-big")"
	pair_mark b-big
}

# A renames x.tmp over x 200 times, alternating all-'a' and all-'b' content;
# every read of x must be whole: 64 KiB of one letter.
t_rename_never_torn() {
	reads=0 seen_a=0 seen_b=0 enoent=0 bad=""
	pair_mark b-reading
	while [ ! -e "$PAIR_DIR/a-renamed" ]; do
		# A bad read ends the loop, not the check: A still gets its marker.
		if ! got=$(fsops uniform "$V/x" 2>&1); then
			# JuiceFS frees a file another client renamed over even while this
			# client has it open (docs/BACKENDS.md): a clean ENOENT, from the
			# open or the read, is that backend's answer. Never torn data.
			case "$got" in
			*"(ENOENT)"*) if backend_lacks cross-client-unlinked-open; then
				enoent=$((enoent + 1))
				continue
			fi ;;
			esac
			bad="read $reads: $got"
			break
		fi
		case "$got" in
		"65536 a") seen_a=$((seen_a + 1)) ;;
		"65536 b") seen_b=$((seen_b + 1)) ;;
		*) bad="read $reads: x is '$got', want 65536 bytes of a or of b"; break ;;
		esac
		reads=$((reads + 1))
	done
	pair_await a-renamed 120
	info "rename-never-torn: $reads whole reads during $(cat "$PAIR_DIR/a-renamed") renames ($seen_a all-a, $seen_b all-b, $enoent ENOENT)"
	pair_mark b-renames-checked
	[ -z "$bad" ] || die "$bad"
	[ $reads -ge 5 ] || die "only $reads reads during the renames"
	[ $seen_a -gt 0 ] && [ $seen_b -gt 0 ] || die "saw only one version ($seen_a all-a, $seen_b all-b)"
}

# B is read-only, so its locks are read locks: each conflicts with A's write lock.
t_locks_conflict() {
	pair_await a-locked
	for f in lk-posix lk-ofd; do
		errno EAGAIN trylock posix-read "$V/$f"
		errno EAGAIN trylock ofd-read "$V/$f"
		errno EAGAIN trylock flock-read "$V/$f"
	done
	# A file A did not lock: the same read locks are granted.
	errno OK trylock posix-read "$V/seen"
	errno OK trylock ofd-read "$V/seen"
	errno OK trylock flock-read "$V/seen"
	pair_mark b-checked-locks
}

t_setlkw_woken_by_unlock() {
	pair_await a-locked-wait
	fsops lockwait posix-read "$V/lk-wait" >/tmp/w-posix 2>&1 &
	p1=$!
	fsops lockwait flock-read "$V/lk-wait" >/tmp/w-flock 2>&1 &
	p2=$!
	sleep 2
	kill -0 $p1 && kill -0 $p2 || die "a waiter ended while A held the locks: $(cat /tmp/w-posix /tmp/w-flock)"
	[ ! -s /tmp/w-posix ] && [ ! -s /tmp/w-flock ] || die "granted while A held the locks: $(cat /tmp/w-posix /tmp/w-flock)"
	pair_mark b-waiting
	pair_await a-unlocked
	wait_until 30 grep -qx locked /tmp/w-posix || die "F_SETLKW not woken by A's unlock: $(cat /tmp/w-posix)"
	wait_until 30 grep -qx locked /tmp/w-flock || die "flock not woken by A's unlock: $(cat /tmp/w-flock)"
	wait $p1 && wait $p2 || die "a waiter failed: $(cat /tmp/w-posix /tmp/w-flock)"
	pair_mark b-woke
}

# What B sees of A's writes through a shared map: before A's msync, whatever
# the guest kernel of A has written back (recorded, not asserted: it depends on
# A's writeback); after A's msync, the new data, by read and by B's own map.
t_mmap_seen_after_msync() {
	pair_await a-mapped
	info "mmap: before A's msync B reads '$(head -c 11 "$V/mm")'"
	pair_mark b-looked
	pair_await a-msynced
	eq "read after A's msync" "$(head -c 11 "$V/mm")" mapped-by-A
	eq "B's shared read-only map after A's msync" "$(fsops mmap read "$V/mm" 0 11)" mapped-by-A
	eq "the rest of the file" "$(tail -c 4085 "$V/mm" | tr -d .)" ""
	pair_mark b-mmap-checked
}

t_kill_releases_locks() {
	pair_await a-holding 120
	errno EAGAIN trylock posix-read "$V/lk-kill"
	errno EAGAIN trylock flock-read "$V/lk-kill"
	fsops lockwait posix-read "$V/lk-kill" >/tmp/w-kill 2>&1 &
	p=$!
	sleep 1
	[ ! -s /tmp/w-kill ] || die "granted while A held the lock: $(cat /tmp/w-kill)"
	pair_mark b-waiting-kill
	pair_await a-killed 180
	wait_until 30 grep -qx locked /tmp/w-kill || die "F_SETLKW not woken when A's VM was killed: $(cat /tmp/w-kill)"
	wait $p || die "waiter: $(cat /tmp/w-kill)"
	errno OK trylock flock-read "$V/lk-kill"
	errno OK trylock ofd-read "$V/lk-kill"
}

run meet t_meet
run readonly-erofs t_readonly
run writes-seen-at-once t_writes_seen_at_once
run rename-never-torn t_rename_never_torn
run locks-conflict t_locks_conflict
run setlkw-woken-by-unlock t_setlkw_woken_by_unlock
run mmap-seen-after-msync t_mmap_seen_after_msync
run kill-releases-locks t_kill_releases_locks
