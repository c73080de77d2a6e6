# Guest side of the fio benchmark suite (busybox sh + fio + /bin/fsops).
#
# Runs fio on the virtio-fs share and prints each run's JSON between markers
# on the console, for benches/compare.sh to parse from the serial log:
#   FIO-JSON-BEGIN <job> <numjobs>
#   { ...fio --output-format=json... }
#   FIO-JSON-END
#   META-JSON {"files": N, "workers": P, "create_s": .., "stat_s": .., "readdir_s": .., "unlink_s": ..}
#
# Jobs (numjobs 1 and 2 each, one shared data file, O_DIRECT):
#   seqread / seqwrite        bs=1M  libaio iodepth 8
#   randread / randwrite      bs=4k  libaio iodepth 32
#   randread-lat              bs=4k  psync (latency)
# then metadata: create, stat (ls -l), readdir and unlink of META_FILES
# files, split over one worker per guest CPU.
#
# Parameters come from $M/.fio-params if the host put one in the share
# (shell assignments), else the defaults below. The same script runs on the
# host for the native ceiling: FIO_HOST_DIR=DIR sh fio.sh (buffered I/O there,
# as the daemons do on the host).

if [ -n "$FIO_HOST_DIR" ]; then
	M=$FIO_HOST_DIR
	run() { _n=$1; shift; if "$@"; then echo "VMTEST PASS $_n"; else echo "VMTEST FAIL $_n: exit status $?"; fi; }
	now() { date +%s.%N; }
	DIRECT=0
else
	. /lib/vmtest.sh
	DIRECT=1
fi

FIO_SIZE=128M        # the data file
FIO_RUNTIME=5        # seconds per fio run (time_based)
FIO_NUMJOBS="1 2"
FIO_JOBS="seqread seqwrite randread randwrite randread-lat"
META_FILES=10000
META_WORKERS=""      # default: one per CPU
FIO_EXTRA=""         # more fio options for every job (e.g. --cpus_allowed=1)
[ -f "$M/.fio-params" ] && . "$M/.fio-params"
META_WORKERS=${META_WORKERS:-$(nproc)}

D=$M/fio-bench
rm -rf "$D"
mkdir -p "$D"
DATA=$D/data.fio
echo "VMTEST INFO fio: size=$FIO_SIZE runtime=${FIO_RUNTIME}s numjobs='$FIO_NUMJOBS' jobs='$FIO_JOBS' meta_files=$META_FILES workers=$META_WORKERS direct=$DIRECT"

# fio_job NAME NUMJOBS: the fio options of one run
fio_args() {
	case "$1" in
	seqread) echo "--rw=read --bs=1M --ioengine=libaio --iodepth=8" ;;
	seqwrite) echo "--rw=write --bs=1M --ioengine=libaio --iodepth=8" ;;
	randread) echo "--rw=randread --bs=4k --ioengine=libaio --iodepth=32" ;;
	randwrite) echo "--rw=randwrite --bs=4k --ioengine=libaio --iodepth=32" ;;
	randread-lat) echo "--rw=randread --bs=4k --ioengine=psync --iodepth=1" ;;
	*) return 1 ;;
	esac
}

layout() {
	# Lay the data file out once (sequential 1M writes), so read jobs never
	# measure the layout and every daemon reads the same file.
	fio --name=layout --filename="$DATA" --size="$FIO_SIZE" --rw=write --bs=1M \
		--ioengine=psync --direct=$DIRECT --output-format=json >/tmp/fio-layout.json 2>/tmp/fio-layout.err
}

fio_one() { # fio_one JOB NUMJOBS
	_args=$(fio_args "$1") || return 2
	# shellcheck disable=SC2086 # word-split the option list
	fio --name="$1" --filename="$DATA" --size="$FIO_SIZE" $_args --numjobs="$2" \
		--direct=$DIRECT --time_based --runtime="$FIO_RUNTIME" --group_reporting $FIO_EXTRA \
		--output-format=json >"/tmp/fio-$1-$2.json" 2>/tmp/fio.err
	_rc=$?
	[ $_rc = 0 ] || { cat /tmp/fio.err >&2; return $_rc; }
	grep -q '"jobs"' "/tmp/fio-$1-$2.json"
}

# print_json JOB NUMJOBS: the run's JSON between markers (outside `run`,
# which keeps a check's output to itself)
print_json() {
	[ -f "/tmp/fio-$1-$2.json" ] || return 0
	echo "FIO-JSON-BEGIN $1 $2"
	cat "/tmp/fio-$1-$2.json"
	echo "FIO-JSON-END"
	rm -f "/tmp/fio-$1-$2.json"
}

# meta_phase PHASE: run PHASE in every worker's directory in parallel
meta_phase() {
	_per=$((META_FILES / META_WORKERS))
	_pids=""
	_w=0
	while [ $_w -lt "$META_WORKERS" ]; do
		_dir=$D/meta$_w
		case "$1" in
		create) mkdir -p "$_dir" && fsops mkfiles "$_dir" f "$_per" & ;;
		stat) ls -l "$_dir" >/dev/null & ;;
		readdir) fsops readdir "$_dir" >"/tmp/readdir.$_w" & ;;
		unlink) fsops rmfiles "$_dir" f "$_per" & ;;
		esac
		_pids="$_pids $!"
		_w=$((_w + 1))
	done
	_rc=0
	for _p in $_pids; do wait "$_p" || _rc=1; done
	return $_rc
}

metadata() {
	_per=$((META_FILES / META_WORKERS))
	t0=$(now)
	meta_phase create || return 1
	t1=$(now)
	meta_phase stat || return 1
	t2=$(now)
	meta_phase readdir || return 1
	t3=$(now)
	_w=0
	while [ $_w -lt "$META_WORKERS" ]; do
		[ "$(cat /tmp/readdir.$_w)" = "$_per" ] || { echo "readdir of meta$_w: $(cat /tmp/readdir.$_w) entries, want $_per" >&2; return 1; }
		_w=$((_w + 1))
	done
	meta_phase unlink || return 1
	t4=$(now)
	echo "META-JSON $(awk -v f=$((_per * META_WORKERS)) -v w="$META_WORKERS" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v e="$t4" \
		'BEGIN {printf "{\"files\": %d, \"workers\": %d, \"create_s\": %.3f, \"stat_s\": %.3f, \"readdir_s\": %.3f, \"unlink_s\": %.3f}", f, w, b-a, c-b, d-c, e-d}')" >/tmp/meta.json
}

run fio-layout layout
for job in $FIO_JOBS; do
	for nj in $FIO_NUMJOBS; do
		run "fio-$job-nj$nj" fio_one "$job" "$nj"
		print_json "$job" "$nj"
	done
done
run fio-metadata metadata
[ -f /tmp/meta.json ] && cat /tmp/meta.json
rm -rf "$D"
