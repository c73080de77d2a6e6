# Guest side of the fioverify suite (busybox sh + fio): fio with verify on the
# virtio-fs share, one short run, one job per guest CPU, each job on its own CPU
# (so with 2 request queues and 2 vCPUs both queues carry the I/O). Checked: every
# job wrote, read back and verified its data (crc32c, verify_fatal), fio exited 0
# with err=0 in every job, the files are whole afterwards (a second, read-only
# verify pass), and with 2+ queues and 2+ CPUs each request queue completed
# requests. The throughput of each pass is printed (VMTEST INFO fio-verify ...),
# not judged: the VM suites assert no times.
# Runs alone (run-vm.sh --suite fioverify) or after another suite in the same boot
# (run-vm.sh --also fioverify). Sizes: FIOVERIFY_SIZE per job (default 16M, fio's
# syntax), FIOVERIFY_BS (4k); vmtest.env.NAME=VALUE on the kernel command line.
. /lib/vmtest.sh

FV=$M/fioverify
SIZE=${FIOVERIFY_SIZE:-16M}
BS=${FIOVERIFY_BS:-4k}
NJ=$(nproc)
rm -rf "$FV"
mkdir -p "$FV"

# "NAME COUNT" per virtio-fs request queue interrupt, summed over CPUs.
fv_irqs() {
	awk '/requests\.[0-9]+/ {
		s = 0
		for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i
		print $NF, s
	}' /proc/interrupts
}

# fv_run NAME OUT FIO-ARGS...: one fio run; fails unless it exits 0 and every
# job reports err=0
fv_run() {
	_n=$1 _o=$2
	shift 2
	fio --name="$_n" --directory="$FV" --size="$SIZE" --bs="$BS" --numjobs="$NJ" \
		--cpus_allowed=0-$((NJ - 1)) --cpus_allowed_policy=split --group_reporting=0 \
		--ioengine=psync --verify=crc32c --verify_fatal=1 "$@" --output="$_o" >/dev/null 2>&1 ||
		die "fio $_n exited $?: $(grep -iE 'err|verify|fail' "$_o" | head -n 4 | tr '\n' ' ')"
	_jobs=$(grep -c 'err= 0' "$_o")
	eq "fio $_n jobs with err=0" "$_jobs" "$NJ"
	info "fio-verify $_n: $NJ job(s) x $SIZE bs=$BS: $(grep -E '^ *(READ|WRITE):' "$_o" | sed 's/^ *//' | cut -d, -f1 | tr '\n' ' ')"
}

t_write_verify() {
	fv_irqs >/tmp/fv-irq.before
	# Each job writes its file at random offsets, then reads it all back and
	# checks every block's crc32c (do_verify after the write phase).
	fv_run randwrite-verify /tmp/fv-write.txt --rw=randwrite --do_verify=1
	fv_irqs >/tmp/fv-irq.after
}

t_reverify() {
	# A fresh pass over the same files: read and verify only (the data was
	# written by the run before, through the daemon, and must still be whole).
	fv_run randwrite-verify /tmp/fv-reread.txt --rw=randwrite --verify_only=1
}

t_queues_used() {
	nq=$(wc -l </tmp/fv-irq.after)
	if [ "$nq" -lt 2 ] || [ "$NJ" -lt 2 ]; then
		info "fio-verify: $nq request queue(s), $NJ cpu(s): one queue, nothing more to check"
		eq "request queues with completions" "$(awk '$2 > 0' /tmp/fv-irq.after | wc -l)" 1
		return 0
	fi
	for q in $(awk '{print $1}' /tmp/fv-irq.after); do
		b=$(awk -v q="$q" '$1 == q {print $2}' /tmp/fv-irq.before)
		a=$(awk -v q="$q" '$1 == q {print $2}' /tmp/fv-irq.after)
		[ "${a:-0}" -gt "${b:-0}" ] || die "no completions on $q during the fio run ($b -> $a)"
	done
	info "fio-verify: request-queue interrupts $(paste -d' ' /tmp/fv-irq.before /tmp/fv-irq.after | awk '{printf "%s %d->%d  ", $1, $2, $4}')"
}

run fio-verify-write-read t_write_verify
run fio-verify-again t_reverify
run fio-verify-queues-used t_queues_used
rm -rf "$FV"
