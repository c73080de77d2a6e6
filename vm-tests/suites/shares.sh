# Guest side of the shares suite: SharedDir restricted to allowed dirs, with
# per-share read-only. The host (shares.setup.sh) made SharedDir hold a (rw),
# b (ro), c (rw) and hidden (not allowed, holds a secret), with symlinks in a
# pointing at the secret and out of the share; the daemon runs with
# --allowed-dir a --allowed-dir b:ro --allowed-dir c. shares.hook.sh renames
# a/d1 <-> a/d2 on the host while the guest uses it; shares.host.sh checks
# what the guest left behind.
. /lib/vmtest.sh

# Two parts, so that no file in the guest holds the whole secret string.
SECRET="VOLFSD-HIDDEN-""SECRET-5f9c2e71"
A=$M/a
Bro=$M/b
C=$M/c
RENAME_SECS=${RENAME_SECS:-15}

# no_secret WHAT FILE: FILE must not contain the secret
no_secret() {
	if grep -q "$SECRET" "$2" 2>/dev/null; then die "$1: THE SECRET LEAKED: $(head -c 200 "$2")"; fi
}

listing() { ls -a "$1" | tr '\n' ' '; }

t_root_listing() {
	eq "ls /mnt" "$(ls "$M" | tr '\n' ' ')" "a b c "
	eq "ls -a /mnt" "$(listing "$M")" ". .. a b c "
	eq "readdir /mnt" "$(fsops readdir -l "$M" | sort | tr '\n' ' ')" "a b c "
}

t_hidden_invisible() {
	errno ENOENT stat "$M/hidden"
	errno ENOENT stat "$M/hidden/secret"
	errno ENOENT open "$M/hidden/secret" r
	errno ENOENT stat "$M/hidden/dir/secret2"
	fails cat "$M/hidden/secret"
	fails ls "$M/hidden"
	cd "$M"
	errno ENOENT stat hidden
	errno ENOENT stat ./hidden/../a
}

# The virtual root is traversable, not writable (EACCES), and creating the
# hidden name there must not reach the host's hidden dir.
t_root_not_writable() {
	errno EACCES mkdir "$M/newdir"
	errno EACCES mkdir "$M/hidden"
	errno EACCES open "$M/newfile" wc
	errno EACCES open "$M/hidden" wc
	errno EACCES symlink /etc "$M/newlink"
	errno EACCES mkfifo "$M/fifo"
	errno ENOENT stat "$M/hidden"
	eq "ls /mnt after" "$(ls "$M" | tr '\n' ' ')" "a b c "
}

t_b_readable() {
	eq "b listing" "$(listing "$Bro")" ". .. emptydir link-to-readme random.bin readme.txt sub "
	eq "b/readme.txt" "$(cat "$Bro/readme.txt")" "read-only share b"
	eq "b/sub/nested.txt" "$(cat "$Bro/sub/nested.txt")" "nested in b"
	eq "readlink b/link-to-readme" "$(readlink "$Bro/link-to-readme")" readme.txt
	eq "read through b's symlink" "$(cat "$Bro/link-to-readme")" "read-only share b"
	eq "b/random.bin size" "$(size "$Bro/random.bin")" 65536
	# shares.host.sh compares this with the host's checksum.
	sha "$Bro/random.bin" >"$A/b-random.sha256"
}

t_b_readonly() {
	f=$Bro/readme.txt
	errno EROFS open "$Bro/new" wc
	errno EROFS open "$Bro/new" cx
	errno EROFS open "$Bro/sub/new" wc
	errno EROFS open "$f" w
	errno EROFS open "$f" rw
	errno EROFS open "$f" a
	errno EROFS open "$f" wt
	errno EROFS truncate "$f" 0
	# mmap: no writable shared map (the file cannot be opened for writing, and a
	# read-only open refuses one); a read-only shared map works.
	errno EROFS mmap write "$f" 0 x sync
	errno EACCES mmap rwmap-rdonly "$f"
	eq "shared read-only map of b/readme.txt" "$(fsops mmap read "$f" 0 17)" "read-only share b"
	errno EROFS truncate "$f" 100000
	errno EROFS fallocate alloc "$f" 0 4096
	errno EROFS mkdir "$Bro/newdir"
	errno EROFS mkdir "$Bro/sub/newdir"
	errno EROFS unlink "$f"
	errno EROFS unlink "$Bro/sub/nested.txt"
	errno EROFS unlink "$Bro/link-to-readme"
	errno EROFS rmdir "$Bro/emptydir"
	errno EROFS rename2 none "$f" "$Bro/renamed"
	errno EROFS rename2 none "$f" "$Bro/sub/readme.txt"
	errno EROFS rename2 none "$Bro/sub" "$Bro/sub2"
	errno EROFS rename2 exchange "$f" "$Bro/random.bin"
	errno EROFS chmod 0600 "$f"
	errno EROFS chmod 0700 "$Bro/sub"
	errno EROFS touch "$f"
	errno EROFS utimens "$f" 1 2
	errno EROFS symlink readme.txt "$Bro/newlink"
	errno EROFS link "$f" "$Bro/hardlink"
	errno EROFS mkfifo "$Bro/fifo"
	# The same through the shell and busybox tools.
	fails sh -c "echo x >$Bro/new2"
	fails sh -c "echo x >>$f"
	fails sh -c "echo x >$f"
	fails truncate -s 0 "$f"
	fails mkdir "$Bro/newdir2"
	fails rm -f "$f"
	fails rm -rf "$Bro/sub"
	fails mv "$f" "$Bro/renamed2"
	fails chmod 600 "$f"
	fails touch "$f"
	fails touch "$Bro/newfile"
	fails chown 1:1 "$f"
	eq "b/readme.txt after" "$(cat "$f")" "read-only share b"
	eq "b listing after" "$(listing "$Bro")" ". .. emptydir link-to-readme random.bin readme.txt sub "
	eq "b/sub listing after" "$(listing "$Bro/sub")" ". .. nested.txt "
	eq "b/readme.txt mode after" "$(stat -c %a "$f")" 644
	eq "b/readme.txt mtime after" "$(stat -c %Y "$f")" 1577934245
}

t_a_writable() {
	cd "$A"
	echo "written by the guest" >new.txt
	echo more >>new.txt
	eq "new.txt" "$(cat new.txt)" "written by the guest
more"
	mkdir -p newdir/deeper
	echo deep >newdir/deeper/file
	mv new.txt renamed.txt
	mv newdir newdir2
	eq "renamed dir content" "$(cat newdir2/deeper/file)" deep
	rm rm-me
	[ ! -e rm-me ] || die "rm-me still there"
	echo truncate-me >trunc.txt
	truncate -s 4 trunc.txt
	chmod 0600 renamed.txt
	eq "mode" "$(stat -c %a renamed.txt)" 600
	ln -s renamed.txt guest-link
	ln renamed.txt hardlink.txt
	eq "nlink" "$(stat -c %h renamed.txt)" 2
	mkdir gone && rmdir gone
	fsops pattern write pattern.bin 2 11
	sha pattern.bin >pattern.bin.sha256
}

t_symlinks() {
	cd "$A"
	eq "readlink to-secret" "$(readlink to-secret)" ../hidden/secret
	eq "readlink to-etc" "$(readlink to-etc)" /etc/hostname
	eq "readlink to-root" "$(readlink to-root)" /
	eq "readlink to-abs" "$(readlink to-abs)" "$(cat abs-link-target.txt)"
	eq "readlink d1/to-hidden-dir" "$(readlink d1/to-hidden-dir)" ../../hidden
	# ../hidden/secret resolves in the guest: /mnt/hidden/secret, which
	# does not exist.
	errno ENOENT open to-secret r
	cat to-secret >/tmp/out 2>&1 || true
	no_secret "cat a/to-secret" /tmp/out
	errno ENOENT stat d1/to-hidden-dir
	cat d1/to-hidden-dir/secret >/tmp/out 2>&1 || true
	no_secret "cat a/d1/to-hidden-dir/secret" /tmp/out
	# /etc/hostname: the guest's own (the initramfs has none), never the host's.
	r=$(fsops -e open to-etc r)
	cat to-etc >/tmp/out 2>&1 || true
	no_secret "cat a/to-etc" /tmp/out
	info "a/to-etc -> /etc/hostname: open gives $r (guest has /etc/hostname: $([ -e /etc/hostname ] && echo yes || echo no))"
	if [ "$r" = OK ]; then
		eq "a/to-etc reads the guest's /etc/hostname" "$(cat to-etc)" "$(cat /etc/hostname)"
	else
		eq "a/to-etc errno" "$r" ENOENT
	fi
	hh=$(cat host-hostname.txt)
	if [ -n "$hh" ] && grep -qx "$hh" /tmp/out; then die "a/to-etc shows the host's hostname '$hh'"; fi
	# / is the guest's root.
	[ -f to-root/init ] && [ -f to-root/suites/shares.sh ] || die "a/to-root/ is not the guest's root: $(ls to-root | tr '\n' ' ')"
	eq "a/to-root inode" "$(stat -L -c %d:%i to-root)" "$(stat -c %d:%i /)"
	# The host's absolute path does not exist in the guest.
	errno ENOENT open to-abs r
	cat to-abs >/tmp/out 2>&1 || true
	no_secret "cat a/to-abs" /tmp/out
	for l in to-secret to-etc to-root to-abs d1/to-hidden-dir; do
		eq "type of $l" "$(stat -c %F "$l")" "symbolic link"
	done
}

t_secret_search() {
	# find does not follow symlinks: this is everything the mount reaches.
	find "$M" >/tmp/all
	n=$(wc -l </tmp/all)
	[ "$n" -gt 20 ] || die "find $M found only $n entries"
	info "find $M: $n entries"
	if grep -E '/(hidden|secret|secret2)$' /tmp/all; then die "a hidden name is reachable"; fi
	find "$M" -type f >/tmp/files
	while IFS= read -r f; do
		if grep -q "$SECRET" "$f"; then die "THE SECRET is in $f"; fi
	done </tmp/files
	info "searched $(wc -l </tmp/files) files under $M for the secret"
	# grep -r over the mount (busybox grep -r does not follow symlinks).
	if grep -r -l "$SECRET" "$M" 2>/dev/null; then die "grep -r found the secret"; fi
	# Every symlink, read through.
	find "$M" -type l >/tmp/links
	while IFS= read -r l; do
		[ -d "$l" ] && continue # to-root: the guest's own /
		cat "$l" >/tmp/out 2>&1 || true
		no_secret "cat $l" /tmp/out
	done </tmp/links
}

t_dotdot() {
	mkdir -p "$A/dir/sub"
	cd "$A/dir/sub"
	seq=""
	for i in 1 2 3 4 5 6; do
		cd -P ..
		p=$(/bin/pwd -P)
		seq="$seq $p"
		case "$p" in
		/mnt) eq "ls in /mnt" "$(ls | tr '\n' ' ')" "a b c " ;;
		/) [ -f init ] && [ -d suites ] || die "/ is not the guest's root: $(ls | tr '\n' ' ')" ;;
		esac
	done
	eq "cd .. sequence" "$seq" " /mnt/a/dir /mnt/a /mnt / / /"
	eq "ls /mnt/a/.." "$(ls "$A/.." | tr '\n' ' ')" "a b c "
	eq "ls /mnt/b/.." "$(ls "$Bro/.." | tr '\n' ' ')" "a b c "
	eq "ls /mnt/a/dir/sub/../../.." "$(ls "$A/dir/sub/../../.." | tr '\n' ' ')" "a b c "
	eq "/mnt/a/.. is /mnt" "$(stat -c %d:%i "$A/..")" "$(stat -c %d:%i "$M")"
	eq "/mnt/a/../.. is /" "$(stat -c %d:%i "$A/../..")" "$(stat -c %d:%i /)"
	cd "$A/dir/sub" && cd ../../../..
	[ -f init ] || die "cd ../../../.. from /mnt/a/dir/sub is not /"
	rmdir "$A/dir/sub" "$A/dir"
}

# a/d1 is renamed to a/d2 and back on the host all along (shares.hook.sh)
# while the guest works in it.
t_host_renames() {
	host_step rename-start
	wait_until 30 test -d "$A/d2"
	end=$(($(date +%s) + RENAME_SECS))
	# Past RENAME_SECS the rounds go on until the guest has read the directory under
	# both names (up to 20 times as long): a slow guest (nested under
	# cloud-hypervisor: 3 rounds in 15 s, most absolute reads landing mid-rename)
	# may otherwise never look while it is d1.
	last=$((end + 19 * RENAME_SECS))
	rel_ok=0 rel_fail=0 abs_ok=0 abs_fail=0 seen_d1=0 seen_d2=0 rounds=0
	# A second process walks the share in the meantime.
	rm -f /tmp/stop-walker /tmp/walker
	trap 'touch /tmp/stop-walker' EXIT
	(
		set +e # find fails while directories move; keep walking
		w=0
		while [ ! -e /tmp/stop-walker ]; do
			w=$((w + 1))
			find "$A" >/dev/null 2>&1
			if cat "$A"/d1/f1 "$A"/d2/f1 2>/dev/null | grep -q "$SECRET"; then echo LEAK >>/tmp/walker; fi
		done
		echo "done $w" >>/tmp/walker
	) >/dev/null 2>&1 &
	tries=0
	until cd "$A/d1" 2>/dev/null || cd "$A/d2" 2>/dev/null; do
		tries=$((tries + 1))
		[ $tries -lt 100 ] || die "cannot cd into a/d1 or a/d2"
	done
	while now=$(date +%s); [ "$now" -lt $end ] ||
		{ [ "$now" -lt $last ] && [ $((seen_d1 + seen_d2)) -lt 2 ]; }; do
		rounds=$((rounds + 1))
		for i in 0 3 7; do
			if got=$(cat f$i 2>&1) && [ "$got" = "d-content-$i" ]; then
				rel_ok=$((rel_ok + 1))
			else
				rel_fail=$((rel_fail + 1))
				[ $rel_fail -gt 5 ] || info "read of f$i in the cwd: '$got'"
			fi
			case "$got" in *"$SECRET"*) die "THE SECRET via cwd f$i" ;; esac
		done
		got=$(cat inner/x 2>&1) || true
		eq "cwd inner/x" "$got" inner
		names=$(ls | tr '\n' ' ')
		eq "cwd listing" "$names" "f0 f1 f2 f3 f4 f5 f6 f7 inner to-hidden-dir "
		cat to-hidden-dir/secret >/tmp/out 2>&1 || true
		no_secret "cwd to-hidden-dir/secret" /tmp/out
		for d in d1 d2; do
			if got=$(cat "$A/$d/f5" 2>/dev/null); then
				eq "/mnt/a/$d/f5" "$got" d-content-5
				abs_ok=$((abs_ok + 1))
				eval "seen_$d=1"
			else
				abs_fail=$((abs_fail + 1))
			fi
		done
		case "$(cat "$A"/d?/f6 2>&1)" in *"$SECRET"*) die "THE SECRET via /mnt/a/d?/f6" ;; esac
	done
	touch /tmp/stop-walker
	wait
	host_step rename-stop
	wait_until 30 test -e "$A/.renames-done"
	info "host renames: $(cat "$A/.renames-done"); guest rounds=$rounds cwd reads ok=$rel_ok failed=$rel_fail; absolute-path reads ok=$abs_ok ENOENT=$abs_fail; pwd in the renamed dir: $(/bin/pwd -P 2>&1)"
	cd "$A"
	eq "cwd reads that failed" "$rel_fail" 0
	[ "$rel_ok" -gt 0 ] || die "no reads in the cwd"
	[ $seen_d1 = 1 ] && [ $seen_d2 = 1 ] || die "the guest did not see both names (d1: $seen_d1, d2: $seen_d2)"
	if grep -q LEAK /tmp/walker; then die "the walker saw the secret"; fi
	case "$(cat /tmp/walker)" in "done "*) info "walker: $(cat /tmp/walker) walks of /mnt/a" ;; *) die "walker: $(cat /tmp/walker)" ;; esac
	eq "d1 after the renames" "$(cat "$A/d1/f4")" d-content-4
	[ ! -e "$A/d2" ] || die "d2 still there after the renames stopped"
}

t_mv_to_readonly() {
	info "rename(2) /mnt/a/f -> /mnt/b/f: $(fsops -e rename2 none "$A/f" "$Bro/f")"
	if mv "$A/f" "$Bro/" 2>/tmp/mv.err; then die "mv a/f into b succeeded"; fi
	info "mv /mnt/a/f /mnt/b/: $(cat /tmp/mv.err)"
	grep -q 'Read-only file system' /tmp/mv.err || die "mv error is not EROFS: $(cat /tmp/mv.err)"
	eq "a/f intact" "$(cat "$A/f")" "file f in a"
	errno ENOENT stat "$Bro/f"
	errno EXDEV link "$A/f" "$Bro/f-link"
}

t_mv_between_rw() {
	eq "rename(2) /mnt/a/g -> /mnt/c/g" "$(fsops -e rename2 none "$A/g" "$C/g")" EXDEV
	mv "$A/g" "$C/"
	eq "c/g" "$(cat "$C/g")" "file g in a, moved to c by the guest"
	errno ENOENT stat "$A/g"
	errno EXDEV link "$A/f" "$C/f-link"
	mkdir "$A/mvdir" && echo in-dir >"$A/mvdir/x"
	mv "$A/mvdir" "$C/"
	eq "c/mvdir/x" "$(cat "$C/mvdir/x")" in-dir
	errno ENOENT stat "$A/mvdir"
}

t_st_dev() {
	da=$(stat -c %d "$A") db=$(stat -c %d "$Bro") dc=$(stat -c %d "$C") dr=$(stat -c %d "$M")
	info "st_dev: /mnt=$dr a=$da b=$db c=$dc"
	info "guest mounts: $(grep virtiofs /proc/mounts | awk '{print $2 "(" $4 ")"}' | tr '\n' ' ')"
	ne "st_dev of a vs b" "$da" "$db"
	ne "st_dev of a vs c" "$da" "$dc"
	ne "st_dev of b vs c" "$db" "$dc"
	eq "st_dev inside a" "$(stat -c %d "$A/d1")" "$da"
	eq "st_dev inside b" "$(stat -c %d "$Bro/sub")" "$db"
}

t_statfs_b() {
	info "stat -f /mnt/b: $(stat -f "$Bro" | tr '\n' ' ' | tr -s ' ')"
	info "fsops statfs /mnt/b: $(fsops statfs "$Bro")"
	info "statvfs flags are not in the FUSE statfs reply: ST_RDONLY is not expected"
	fsops statfs "$Bro" >/dev/null
}

run root-lists-exactly-a-b-c t_root_listing
run hidden-is-enoent t_hidden_invisible
run root-not-writable-eacces t_root_not_writable
run b-readable t_b_readable
run b-readonly-erofs t_b_readonly
run a-writable t_a_writable
run symlinks-resolve-in-guest t_symlinks
run secret-never-reachable t_secret_search
run dotdot-stays-in-guest t_dotdot
run host-renames-dir-in-use t_host_renames
run mv-a-to-b-erofs t_mv_to_readonly
run mv-a-to-c-copies t_mv_between_rw
run st-dev-per-share t_st_dev
run statfs-b-info t_statfs_b
run secret-never-reachable-after t_secret_search
