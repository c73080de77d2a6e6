# Guest side of the basic virtio-fs suite (busybox sh + /bin/fsops).
# The share is mounted at /mnt; everything is done under /mnt/basic and left
# there for vm-tests/suites/basic.host.sh to check on the host afterwards.
# Sizes are chosen to keep the run near 5 minutes under TCG on 2 cores.
. /lib/vmtest.sh

B=$M/basic
BIG_MIB=${BIG_MIB:-256}   # the large-file check (host compares its sha256)
PAR_MIB=${PAR_MIB:-64}    # per process, in the two-queue parallel check
NFILES=${NFILES:-10000}   # files in one directory
rm -rf "$B" "$SYNC"
mkdir -p "$B"
cd "$B" || exit 1

t_create_write_read() {
	echo hello >f
	eq "read" "$(cat f)" hello
	echo world >>f
	eq "append" "$(cat f)" "hello
world"
	eq "size" "$(size f)" 12
	truncate -s 3 f
	eq "truncate shrink" "$(cat f)" hel
	truncate -s 100 f
	eq "truncate grow" "$(size f)" 100
	eq "non-zero bytes in grown tail" "$(tail -c 97 f | tr -d '\000' | wc -c)" 0
	fsops pwrite f 10 MIDDLE
	eq "pwrite" "$(dd if=f bs=1 skip=10 count=6 2>/dev/null)" MIDDLE
	: >f
	eq "O_TRUNC" "$(size f)" 0
	echo keep >f.final
}

t_mkdir_rmdir() {
	mkdir -p d1/d2/d3
	[ -d d1/d2/d3 ] || die "d1/d2/d3 missing"
	if backend_lacks dir-nlink; then
		eq "nlink of d1 on $VMTEST_BACKEND (no directory link counts)" "$(stat -c %h d1)" 1
	else
		eq "nlink of d1 (one subdir)" "$(stat -c %h d1)" 3
	fi
	fails rmdir d1
	rmdir d1/d2/d3
	[ ! -e d1/d2/d3 ] || die "d1/d2/d3 still there after rmdir"
	rmdir d1/d2 d1
	[ ! -e d1 ] || die "d1 still there"
	fails mkdir "$B"
	mkdir keepdir
}

t_rename() {
	echo A >ra
	mv ra rb
	[ ! -e ra ] || die "old name still exists"
	eq "renamed content" "$(cat rb)" A
	echo OVER >rc
	mv rc rb # replaces an existing file
	eq "replaced content" "$(cat rb)" OVER
	[ ! -e rc ] || die "source of replacing rename still exists"
	mkdir rdir && echo in >rdir/x
	mv rdir rdir2
	eq "file in renamed dir" "$(cat rdir2/x)" in
	echo one >n1 && echo two >n2
	if backend_lacks rename-flags; then
		# The VFS refuses a taken name itself; the backend refuses the flags.
		errno EEXIST rename2 noreplace n1 n2
		errno EINVAL rename2 noreplace n1 n3
		errno EINVAL rename2 exchange n1 n2
		eq "flags refused, source kept" "$(cat n1)" one
		eq "flags refused, target kept" "$(cat n2)" two
		return 0
	fi
	errno EEXIST rename2 noreplace n1 n2
	eq "noreplace kept source" "$(cat n1)" one
	eq "noreplace kept target" "$(cat n2)" two
	errno OK rename2 noreplace n1 n3
	[ ! -e n1 ] || die "n1 remains after noreplace rename to a free name"
	errno OK rename2 exchange n2 n3
	eq "exchange a" "$(cat n2)" one
	eq "exchange b" "$(cat n3)" two
	errno ENOENT rename2 exchange n2 does-not-exist
	mkdir xd && errno OK rename2 exchange n2 xd
	[ -d n2 ] && [ -f xd ] || die "exchange of a file and a directory did not swap them"
	eq "exchanged file" "$(cat xd)" one
}

t_links() {
	echo linked >l1
	if backend_lacks hard-links; then
		errno EOPNOTSUPP link l1 l2
		[ ! -e l2 ] || die "a refused link left l2 behind"
	else
		t_hard_links
	fi
	ln -s l1 s1
	eq "readlink" "$(readlink s1)" l1
	eq "symlink type" "$(stat -c %F s1)" "symbolic link"
	eq "read through symlink" "$(head -n 1 s1)" linked
	ln -s /nonexistent/target dangling
	eq "dangling readlink" "$(readlink dangling)" /nonexistent/target
	fails cat dangling
}

t_hard_links() {
	ln l1 l2
	eq "nlink after link" "$(stat -c %h l1)" 2
	eq "same inode" "$(stat -c %i l2)" "$(stat -c %i l1)"
	echo more >>l2
	eq "write via other link" "$(cat l1)" "linked
more"
	ln l1 l3 && rm l3
	eq "nlink after unlink" "$(stat -c %h l1)" 2
}

t_attrs() {
	echo attrs >a
	chmod 0640 a
	eq "mode" "$(stat -c %a a)" 640
	chmod 0751 a
	eq "mode" "$(stat -c %a a)" 751
	chown 1234:5678 a
	eq "owner" "$(stat -c %u:%g a)" 1234:5678
	echo t >t
	if backend_lacks set-mtime; then
		# An existing file keeps the time set; a file touch -d creates does not.
		fsops utimens t 1000000000.123456789 1500000000.987654321
		eq "mtime seconds of an existing file" "$(stat -c %Y t)" 1500000000
		touch -d "2001-02-03 04:05:06" t2
		ne "touch -d on $VMTEST_BACKEND" "$(date -d @"$(stat -c %Y t2)" '+%Y-%m-%d %H:%M:%S')" "2001-02-03 04:05:06"
	else
		fsops utimens t 1000000000.123456789 1500000000.987654321
		eq "atime/mtime" "$(fsops times t)" "1000000000.123456789 1500000000.987654321"
		touch -d "2001-02-03 04:05:06" t2
		eq "touch -d" "$(date -d @"$(stat -c %Y t2)" '+%Y-%m-%d %H:%M:%S')" "2001-02-03 04:05:06"
	fi
	ctime=$(stat -c %Z a)
	[ "$ctime" -gt 0 ] || die "ctime not set"
}

t_bigfile() {
	fsops pattern write big.bin "$BIG_MIB" 42
	eq "size" "$(size big.bin)" $((BIG_MIB * 1048576))
	fsops pattern verify big.bin "$BIG_MIB" 42
	sha big.bin >big.bin.sha256
}

t_sparse() {
	if backend_lacks holes; then
		t_sparse_without_holes
		return
	fi
	truncate -s 64M sparse
	set -- $(fsops blocks sparse)
	eq "sparse size" "$1" 67108864
	[ "$2" -lt 1048576 ] || die "64M sparse file has $2 bytes allocated"
	fsops pwrite sparse 33554432 DATA
	eq "SEEK_DATA from 0" "$(fsops seek data sparse 0)" 33554432
	h=$(fsops seek hole sparse 33554432)
	[ "$h" -gt 33554432 ] && [ "$h" -le 34603008 ] || die "SEEK_HOLE after data: $h"
	eq "SEEK_HOLE from 0" "$(fsops seek hole sparse 0)" 0
	eq "SEEK_DATA past data" "$(fsops seek data sparse 40000000)" ENXIO
	eq "SEEK_HOLE at EOF" "$(fsops seek hole sparse 67108864)" ENXIO

	# fallocate: plain (grows), keep size, punch hole.
	fsops fallocate alloc falloc 0 1048576
	set -- $(fsops blocks falloc)
	eq "fallocate size" "$1" 1048576
	[ "$2" -ge 1048576 ] || die "fallocate allocated only $2 bytes"
	fsops fallocate keep falloc 1048576 1048576
	set -- $(fsops blocks falloc)
	eq "keep-size size" "$1" 1048576
	[ "$2" -ge 2097152 ] || die "keep-size fallocate allocated only $2 bytes"

	punch_a_hole
	eq "SEEK_HOLE finds the punched hole" "$(fsops seek hole punched 0)" 1048576
	eq "SEEK_DATA after the hole" "$(fsops seek data punched 1048576)" 2097152
	set -- $(fsops blocks punched)
	[ "$2" -le 3145728 ] || die "punched file still has $2 bytes allocated"
	sha punched >punched.sha256
}

# punched: 4 MiB of pattern 7, the second MiB punched out; the data must show it.
punch_a_hole() {
	fsops pattern write punched 4 7
	fsops fallocate punch punched 1048576 1048576
	eq "punch keeps size" "$(size punched)" 4194304
	eq "non-zero bytes in punched range" "$(dd if=punched bs=1048576 skip=1 count=1 2>/dev/null | tr -d '\000' | wc -c)" 0
	fsops pattern write /tmp/p1 1 7
	dd if=punched bs=1048576 count=1 2>/dev/null | cmp -s - /tmp/p1 || die "data before the hole changed"
}

# A backend that keeps no holes (backend-gaps): the same operations, and the
# data they leave must be right; the allocation and SEEK_DATA/SEEK_HOLE give the
# answers of a file stored whole.
t_sparse_without_holes() {
	truncate -s 64M sparse
	set -- $(fsops blocks sparse)
	eq "sparse size" "$1" 67108864
	[ "$2" -ge 67108864 ] || die "allocated on $VMTEST_BACKEND: $2, want at least the length"
	fsops pwrite sparse 33554432 DATA
	eq "data at 32M" "$(dd if=sparse bs=1 skip=33554432 count=4 2>/dev/null)" DATA
	eq "zeros before it" "$(dd if=sparse bs=1048576 count=32 2>/dev/null | tr -d '\000' | wc -c)" 0
	eq "SEEK_DATA from 0: all data" "$(fsops seek data sparse 0)" 0
	eq "SEEK_HOLE from 0: at the end" "$(fsops seek hole sparse 0)" 67108864
	if backend_lacks fallocate; then
		fsops pattern write punched 4 7
		for mode in alloc keep punch zero; do
			errno EOPNOTSUPP fallocate $mode punched 1048576 1048576
		done
		fsops pattern verify punched 4 7
		return 0
	fi
	fsops fallocate alloc falloc 0 1048576
	eq "fallocate size" "$(size falloc)" 1048576
	punch_a_hole
	sha punched >punched.sha256
}

t_odirect() {
	fsops pattern write direct.bin 8 99 direct
	fsops pattern verify direct.bin 8 99 direct
	fsops pattern verify direct.bin 8 99
	sha direct.bin >direct.bin.sha256
}

t_manyfiles() {
	mkdir many
	fsops mkfiles many f "$NFILES"
	eq "readdir count" "$(fsops readdir many)" "$NFILES"
	eq "ls count" "$(ls many | wc -l)" "$NFILES"
	fsops readdir -l many | sort >/tmp/got
	i=0
	while [ $i -lt "$NFILES" ]; do
		echo "f$i"
		i=$((i + 1))
	done | sort >/tmp/want
	cmp -s /tmp/got /tmp/want || die "readdir names differ: $(diff /tmp/want /tmp/got | head -n 5 | tr '\n' ' ')"
	eq "content of a file" "$(cat many/f$((NFILES - 1)))" "f$((NFILES - 1))"
}

t_fsync() {
	fsops fsync synced
	fsops fsync synced data
	eq "fsynced content" "$(cat synced)" "fsync-line
fsync-line"
}

# Two processes, pinned to different CPUs: the virtio-fs driver picks the
# request queue by CPU, so with --queues 2 --smp 2 both queues carry I/O.
t_parallel() {
	ncpu=$(nproc)
	vq_irqs >/tmp/irq.before
	for i in 0 1; do
		cpu=$((i % ncpu))
		(
			if command -v taskset >/dev/null; then pin="taskset -c $cpu"; else pin="fsops pin $cpu"; fi
			$pin sh -c "
				echo \$(fsops getcpu) >par$i.cpu
				fsops pattern write par$i.bin $PAR_MIB $((100 + i)) &&
				fsops pattern verify par$i.bin $PAR_MIB $((100 + i)) &&
				sha256sum par$i.bin | cut -d' ' -f1 >par$i.bin.sha256
			" && rc=0 || rc=$?
			echo $rc >/tmp/par$i.rc
		) &
	done
	wait
	for i in 0 1; do
		eq "writer $i status" "$(cat /tmp/par$i.rc)" 0
		eq "writer $i cpu" "$(cat par$i.cpu)" $((i % ncpu))
	done
	vq_irqs >/tmp/irq.after
	# With 2+ request queues (and MSI-X vectors per queue), each queue must
	# have completed requests: the writers really used both.
	nq=$(wc -l </tmp/irq.after)
	if [ "$nq" -ge 2 ] && [ "$ncpu" -ge 2 ]; then
		for q in requests.0 requests.1; do
			b=$(awk -v q="$q" '$1 ~ q"$" {print $2}' /tmp/irq.before)
			a=$(awk -v q="$q" '$1 ~ q"$" {print $2}' /tmp/irq.after)
			[ -n "$a" ] && [ "${a:-0}" -gt "${b:-0}" ] || die "no interrupts on $q during the parallel writes ($b -> $a)"
		done
		info "request-queue interrupts: $(paste -d' ' /tmp/irq.before /tmp/irq.after | awk '{printf "%s %d->%d  ", $1, $2, $4}')"
	else
		info "parallel: $nq request queue(s), $ncpu cpu(s): per-queue use not checked"
	fi
}

# "NAME COUNT" per virtio-fs request queue interrupt, summed over CPUs.
vq_irqs() {
	awk '/requests\.[0-9]+/ {
		s = 0
		for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i
		print $NF, s
	}' /proc/interrupts
}

t_copy_file_range() {
	fsops pattern write cfr-src.bin 4 5
	fsops cfr cfr-src.bin cfr-dst.bin
	cmp cfr-src.bin cfr-dst.bin || die "copy differs"
	sha cfr-dst.bin >cfr-dst.bin.sha256
}

t_statfs() {
	out=$(fsops statfs "$M")
	echo "$out" >statfs.txt
	set -- $out
	eq "f_type (FUSE_SUPER_MAGIC)" "$1" type=0x65735546
	[ "${2#bsize=}" -gt 0 ] || die "bsize: $2"
	[ "${3#blocks=}" -gt 0 ] || die "blocks: $3"
	[ "${5#bavail=}" -gt 0 ] || die "bavail: $5"
	eq "df sees the mount" "$(df "$M" | tail -n 1 | awk '{print $NF}')" "$M"
}

# Coherence under cache=none, both ways, through the host hook (lib.sh: host).
t_host_to_guest() {
	host_ok create basic/coh1 v1
	eq "host create seen" "$(cat coh1)" v1
	host_ok modify basic/coh1 v2
	eq "host modify (same size) seen" "$(cat coh1)" v2
	host_ok modify basic/coh1 longer-version-3
	eq "host modify (new size) seen" "$(cat coh1)" longer-version-3
	eq "host size seen" "$(size coh1)" 17
	host_ok append basic/coh1 tail
	eq "host append seen" "$(cat coh1)" "longer-version-3
tail"
	host_ok chmod 600 basic/coh1
	eq "host chmod seen" "$(stat -c %a coh1)" 600
	host_ok truncate basic/coh1 4
	eq "host truncate seen" "$(cat coh1)" long
	host_ok rename basic/coh1 basic/coh2
	[ ! -e coh1 ] || die "host rename: old name still visible"
	eq "host rename seen" "$(cat coh2)" long
	host_ok delete basic/coh2
	[ ! -e coh2 ] || die "host delete not seen"
	fails cat coh2
	host_ok mkdir basic/cohdir
	host_ok create basic/cohdir/inner x
	eq "host mkdir+create seen" "$(ls cohdir)" inner
	host_ok delete basic/cohdir/inner
	host_ok rmdir basic/cohdir
	[ ! -e cohdir ] || die "host rmdir not seen"
}

t_guest_to_host() {
	exec 3>gcoh
	echo first >&3 # still open: the data must be on the host already
	host_ok content basic/gcoh first
	echo second >&3
	host_ok check basic/gcoh "$(printf 'first\nsecond\n' | sha256sum | cut -d' ' -f1)"
	exec 3>&-
	fsops pattern write gcoh.bin 1 3
	host_ok check basic/gcoh.bin "$(sha gcoh.bin)"
	truncate -s 5 gcoh
	host_ok size basic/gcoh 5
	chmod 0604 gcoh
	host_ok mode basic/gcoh 604
	mv gcoh gcoh-renamed
	host_ok absent basic/gcoh
	host_ok size basic/gcoh-renamed 5
	rm gcoh-renamed gcoh.bin
	host_ok absent basic/gcoh-renamed
}

# Shared mmap with cache=none: volfsd grants FUSE_DIRECT_IO_ALLOW_MMAP, so the
# guest may map its direct-I/O files shared (without it: ENODEV). What is written
# through the map is on the host after msync(MS_SYNC), and after munmap and close;
# a private map stays private; a new map sees what the host changed.
t_mmap() {
	printf 'aaaaaaaaaaaaaaaa' >mm
	fsops mmap write mm 0 HELLO sync
	host_ok content basic/mm HELLOaaaaaaaaaaa
	eq "read() after msync" "$(cat mm)" HELLOaaaaaaaaaaa
	fsops mmap write mm 8 WORLD unmap
	host_ok content basic/mm HELLOaaaWORLDaaa
	eq "read back through a shared map" "$(fsops mmap read mm 0 16)" HELLOaaaWORLDaaa
	fsops mmap private mm 0 XXXXX
	host_ok content basic/mm HELLOaaaWORLDaaa
	host_ok modify basic/mm bbbbbbbbbbbbbbb
	eq "a new map sees the host's change" "$(fsops mmap read mm 0 15)" bbbbbbbbbbbbbbb
	errno EACCES mmap rwmap-rdonly mm
	rm mm
}

run create-write-read-append-truncate t_create_write_read
run mkdir-rmdir t_mkdir_rmdir
run rename t_rename
run links t_links
run chmod-chown-utimes t_attrs
run fsync t_fsync
run coherence-host-to-guest t_host_to_guest
run coherence-guest-to-host t_guest_to_host
run mmap-shared-cache-none t_mmap
run sparse-fallocate-seek t_sparse
run odirect t_odirect
run copy-file-range t_copy_file_range
run statfs t_statfs
run parallel-two-queues t_parallel
run many-files-readdir t_manyfiles
run bigfile-${BIG_MIB}MiB t_bigfile
