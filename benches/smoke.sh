#!/usr/bin/env bash
# Smoke test of the performance instruments, for CI: asserts only that each
# one ran and validated its data (exit codes, JSON present), never a speed.
#   - volfsd-loadgen against volfsd, every workload (QD1 ones too), tiny sizes, 1 and 2 queues
#     (and against virtiofsd if it is installed: the loadgen must run unchanged);
#   - scale.py (start-up to INIT, held inodes and their memory curve, density) with tiny counts;
#   - idle.py (idle daemons' CPU and memory) with two daemons and a second;
#   - report.py drawing the page and its figures from the kept data (--images);
#   - volfsd-statebench (benches/downtime.sh): one save and load at 1,000 held nodes,
#     volfsd and virtiofsd;
#   - the criterion benches, each run once (--test);
#   - the fio guest suite once under QEMU with tiny sizes: fio ran and printed
#     parseable JSON for every job, and the metadata loop its timings.
# Ends with "N passed, N failed"; exit 0 only if nothing failed. Run as root.
#
# Usage: benches/smoke.sh [--no-build] [--skip-vm] [--skip-criterion]
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BUILD=1
VM=1
CRITERION=1
for a in "$@"; do
	case "$a" in
	--no-build) BUILD=0 ;;
	--skip-vm) VM=0 ;;
	--skip-criterion) CRITERION=0 ;;
	*) echo "smoke: unknown option $a" >&2; exit 2 ;;
	esac
done

PASSED=0
FAILED=0
pass() { echo "SMOKE PASS $1"; PASSED=$((PASSED + 1)); }
fail() { echo "SMOKE FAIL $1: $2"; FAILED=$((FAILED + 1)); }
finish() {
	echo "$PASSED passed, $FAILED failed"
	[[ $FAILED == 0 ]]
	exit
}

WORK=$(mktemp -d /var/tmp/volfsd-smoke.XXXXXX)
DPID=""
cleanup() {
	[[ -n $DPID ]] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT

VOLFSD=$REPO/target/release/volfsd
LOADGEN=$REPO/target/release/volfsd-loadgen
VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")

if [[ $BUILD == 1 ]]; then
	if (cd "$REPO" && cargo build --release --workspace --bins --quiet) >"$WORK/build.log" 2>&1; then
		pass build
	else
		fail build "cargo build --release failed: $(tail -n 3 "$WORK/build.log" | tr '\n' ' ')"
		finish
	fi
fi

# loadgen_check NAME QUEUES DAEMON-CMD...: daemon on a fresh socket, every workload
loadgen_check() {
	local name=$1 queues=$2 sock=$WORK/$1.sock share=$WORK/share-$1 rc=0
	shift 2
	mkdir -p "$share"
	rm -f "$sock"
	"$@" --socket-path="$sock" --shared-dir="$share" >"$WORK/$name.daemon.log" 2>&1 &
	DPID=$!
	timeout 120 "$LOADGEN" --socket "$sock" --shared-dir "$share" --queues "$queues" --qd 8 \
		--duration 0.5 --file-size 8M --files 300 --workload all \
		--json "$WORK/$name.json" >"$WORK/$name.log" 2>&1 || rc=$?
	wait "$DPID" 2>/dev/null
	DPID=""
	if [[ $rc != 0 ]]; then
		fail "$name" "loadgen exit $rc: $(grep -m1 FAILED "$WORK/$name.log" || tail -n 2 "$WORK/$name.log" | tr '\n' ' ')"
	elif ! python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"]; assert len(r)==10 and all(x["verified"] and x["ops"]>0 for x in r)' "$WORK/$name.json"; then
		fail "$name" "JSON report lacks a verified result for every workload"
	elif [[ -n $(ls -A "$share" 2>/dev/null) ]]; then
		fail "$name" "loadgen left files in the shared dir: $(ls -A "$share" | head -n 3 | tr '\n' ' ')"
	else
		pass "$name"
	fi
}

if [[ -x $VOLFSD && -x $LOADGEN ]]; then
	loadgen_check loadgen-volfsd-q1 1 "$VOLFSD" --cache=none --log-level=warn
	loadgen_check loadgen-volfsd-q2 2 "$VOLFSD" --cache=none --log-level=warn
	if [[ -x $VIRTIOFSD ]]; then
		loadgen_check loadgen-virtiofsd 1 "$VIRTIOFSD" --cache=never --log-level=warn
	else
		echo "SMOKE INFO virtiofsd not installed: loadgen not checked against it"
	fi
	# The host floor (no daemon): every workload that has one, a report of each.
	mkdir -p "$WORK/share-floor"
	if "$LOADGEN" --floor --shared-dir "$WORK/share-floor" --file-size 4M --files 100 --duration 0.2 \
		--workload all --quiet --json "$WORK/floor.json" >"$WORK/floor.log" 2>&1 &&
		python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
got = {f["workload"] for f in d["floors"] if f["ops"] > 0 and f["cpu_us_per_op"] > 0}
want = {"randread4k", "randwrite4k", "getattr", "lookup", "metadata"}
sys.exit(0 if want <= got else f"floors missing: {sorted(want - got)}")
' "$WORK/floor.json" 2>>"$WORK/floor.log" && [[ -z $(ls -A "$WORK/share-floor") ]]; then
		pass loadgen-floor
	else
		fail loadgen-floor "$(tail -n 2 "$WORK/floor.log" | tr '\n' ' ') $(ls -A "$WORK/share-floor" | head -n 3 | tr '\n' ' ')"
	fi
else
	fail loadgen "$VOLFSD or $LOADGEN missing (build with cargo build --release --workspace)"
fi

# A loadgen that finds bad data must fail: prepare the read file with a
# first run, then zero every block but the ones sampled when it is reused.
if [[ -x $VOLFSD && -x $LOADGEN ]]; then
	share=$WORK/share-corrupt sock=$WORK/corrupt.sock rc=0 rc2=0
	mkdir -p "$share"
	lg_once() {
		rm -f "$sock"
		"$VOLFSD" --socket-path="$sock" --shared-dir="$share" --cache=none --log-level=error >/dev/null 2>&1 &
		DPID=$!
		timeout 60 "$LOADGEN" --socket "$sock" --shared-dir "$share" --qd 4 --ops 200 --file-size 8M \
			--workload randread4k --keep-files >"$WORK/corrupt.log" 2>&1
		local r=$?
		wait "$DPID" 2>/dev/null
		DPID=""
		return $r
	}
	lg_once || rc=$?
	python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    for b in range(2048):
        if b % 128:
            f.seek(b * 4096)
            f.write(bytes(4096))
' "$share/volfsd-loadgen/read.dat"
	lg_once || rc2=$?
	if [[ $rc == 0 && $rc2 != 0 ]] && grep -q "data mismatch" "$WORK/corrupt.log"; then
		pass loadgen-detects-bad-data
	else
		fail loadgen-detects-bad-data "first run exit $rc, run on corrupted data exit $rc2: $(tail -n 1 "$WORK/corrupt.log")"
	fi
fi

# The scale instruments: a daemon's start-up to INIT and the inodes a frontend
# holds (benches/scale.py; tiny counts; it validates the loadgen's report).
if [[ -x $VOLFSD && -x $LOADGEN ]]; then
	mkdir -p "$WORK/share-scale"
	if timeout 120 python3 "$HERE/scale.py" --loadgen "$LOADGEN" --share "$WORK/share-scale" \
		--out "$WORK/scale.json" --startup-runs 2 --inodes 300 --density 2 \
		--daemon volfsd "$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --log-level warn" \
		--daemon volfsd-fh "$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --log-level warn --inode-file-handles prefer" \
		>"$WORK/scale.log" 2>&1 &&
		python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); r=a["volfsd"]; h=a["volfsd-fh"]["inodes"]; assert r["inodes"]["held"]==300 and r["inodes"]["fds_per_inode"]>0 and r["density"]["daemons"]==2 and len(r["startup_init_ms"])==2 and h["held"]==300 and h["fds_per_inode"]<0.02, (r, h); c=h["curve"]; assert len(c)>=2 and c[0]["inodes"]==0 and c[-1]["inodes"]==300 and [p["inodes"] for p in c]==sorted(p["inodes"] for p in c) and 0<=h["curve_extra_requests"]<50, c' "$WORK/scale.json"; then
		pass scale
	else
		fail scale "$(tail -n 2 "$WORK/scale.log" | tr '\n' ' ')"
	fi
fi

# Idle daemons (benches/idle.py): two daemons, a second of idleness; the JSON has
# each one's CPU and memory.
if [[ -x $VOLFSD && -x $LOADGEN ]]; then
	mkdir -p "$WORK/share-idle"
	if timeout 120 python3 "$HERE/idle.py" --loadgen "$LOADGEN" --share "$WORK/share-idle" --out "$WORK/idle" \
		--daemons 2 --idle-s 1 --settle-s 0.5 --ops 50 \
		--daemon volfsd "$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --log-level warn" \
		>"$WORK/idle.log" 2>&1 &&
		python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runs"]; assert len(r)==1 and r[0]["alive_at_end"]==2 and len(r[0]["cpu_ticks"])==2 and all(k>0 for k in r[0]["rss_anon_kib"]), r' "$WORK/idle/idle.json"; then
		pass idle
	else
		fail idle "$(tail -n 2 "$WORK/idle.log" | tr '\n' ' ')"
	fi
fi

# The page and its figures from the kept data (benches/report.py --images, as
# benches/compare.sh runs it): the command at the top of docs/BENCHMARKS.md.
if python3 -c 'import matplotlib' 2>/dev/null; then
	args=$(sed -n 's/^Generated by `benches\/report.py \([^`]*\)`.*/\1/p' "$REPO/docs/BENCHMARKS.md" |
		sed 's/ --images [^ ]*//')
	# shellcheck disable=SC2086
	if (cd "$REPO" && python3 benches/report.py $args --images "$WORK/images") >"$WORK/page.md" 2>"$WORK/page.log" &&
		head -n 1 "$WORK/page.md" | grep -q '^# Benchmarks' && [[ $(grep -c '^!\[' "$WORK/page.md") -ge 3 ]] &&
		[[ -s $WORK/images/bench-headline-ratios.png && -s $WORK/images/bench-latency.png && -s $WORK/images/bench-held-nodes.png ]]; then
		pass report-figures
	else
		fail report-figures "$(tail -n 2 "$WORK/page.log" | tr '\n' ' ') $(ls "$WORK/images" 2>/dev/null | tr '\n' ' ')"
	fi
else
	fail report-figures "matplotlib missing (tests/install-deps.sh installs it)"
fi

# The device-state bench (benches/downtime.sh's instrument): one pair at 1,000 held
# nodes; both saves and loads must succeed and report their figures.
STATEBENCH=$REPO/target/release/volfsd-statebench
if [[ -x $VOLFSD && -x $STATEBENCH ]]; then
	rc=0
	statebench_run() { # statebench_run NAME DAEMON-LINE
		timeout 300 "$STATEBENCH" run --name "$1" --daemon "$2" --tree "$WORK/statebench-tree" --nodes 1000 \
			--work "$WORK/statebench" --json "$WORK/statebench.jsonl" >>"$WORK/statebench.log" 2>&1 || rc=$?
	}
	names=volfsd
	statebench_run volfsd "$VOLFSD --socket-path {sock} --shared-dir {share} --cache none --inode-file-handles prefer"
	if [[ -x $VIRTIOFSD ]]; then
		names=volfsd,virtiofsd
		statebench_run virtiofsd "$VIRTIOFSD --socket-path {sock} --shared-dir {share} --cache never --inode-file-handles=prefer"
	fi
	if [[ $rc != 0 ]]; then
		fail statebench "exit $rc: $(grep -m1 FAILED "$WORK/statebench.log" || tail -n 2 "$WORK/statebench.log" | tr '\n' ' ')"
	elif python3 -c '
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["daemon"] for r in runs] == sys.argv[2].split(","), runs
for r in runs:
    assert r["held_nodes"] == 1001 and r["verified_nodes"] == 3 and r["state_bytes"] > 0, r
    assert all(r[k] >= 0 for k in ("save_ms", "load_ms", "sum_ms", "log_all_ms", "stop_ms")), r
    assert r["save"]["bytes"] == r["load"]["bytes"] == r["state_bytes"], r
' "$WORK/statebench.jsonl" "$names"; then
		pass statebench
	else
		fail statebench "the JSON lines lack a save, a load or their figures"
	fi
fi

if [[ $CRITERION == 1 ]]; then
	if (cd "$REPO" && timeout 600 cargo bench --quiet -p volfsd-harness --bench request_path -- --test) >"$WORK/bench.log" 2>&1; then
		pass criterion-benches
	else
		fail criterion-benches "$(grep -m1 -iE 'panicked|error' "$WORK/bench.log" || tail -n 2 "$WORK/bench.log" | tr '\n' ' ')"
	fi
fi

if [[ $VM == 1 ]]; then
	share=$WORK/share-fio
	mkdir -p "$share"
	printf 'FIO_SIZE=8M\nFIO_RUNTIME=1\nFIO_NUMJOBS=1\nMETA_FILES=100\n' >"$share/.fio-params"
	rc=0
	"$REPO/vm-tests/run-vm.sh" --daemon "$VOLFSD" --suite fio --shared-dir "$share" --queues 1 \
		--host-hook none --timeout 300 --log-dir "$WORK/fio-logs" >"$WORK/fio.out" 2>&1 || rc=$?
	if [[ $rc != 0 ]]; then
		fail fio-guest "run-vm.sh exit $rc: $(grep -E 'FAIL|error' "$WORK/fio.out" | head -n 3 | tr '\n' ' ')"
	elif python3 - "$WORK/fio-logs/serial.log" <<'EOF'; then
import json, re, sys
text = open(sys.argv[1], "rb").read().decode("utf-8", "replace").replace("\r", "")
blocks = re.findall(r"^FIO-JSON-BEGIN (\S+) (\d+)\n(.*?)^FIO-JSON-END", text, re.S | re.M)
ok = 0
for job, nj, body in blocks:
    j = json.loads(body[body.index("{"):])
    assert j["jobs"], job
    ok += 1
assert ok == 5, f"{ok} fio JSON blocks, want 5"
meta = re.search(r"^META-JSON (\{.*\})$", text, re.M)
assert meta and json.loads(meta.group(1))["files"] == 100, "no META-JSON line"
EOF
		pass fio-guest
	else
		fail fio-guest "serial log lacks fio JSON for every job or the metadata timings"
	fi
fi

finish
