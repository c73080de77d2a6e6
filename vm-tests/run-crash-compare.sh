#!/usr/bin/env bash
# The crash suite against volfsd and against virtiofsd, one after the other on the
# same guest, and what each guest saw, side by side (docs/UPGRADE.md, "What a crash
# costs the guest").
#
#   volfsd (--upgradable): suites/crash.sh as in CI: SIGKILL of the serving process
#     every 2 s, 20 times (VMTEST_CRASHES, VMTEST_CRASH_INTERVAL), under fio with
#     verify, the exclusive-create/rename/unlink loop and fsynced records.
#   virtiofsd: the same guest workload; one SIGKILL, then 60 s of watching the
#     guest (its metadata loop's progress, QEMU, its console), and the VM is ended
#     (nothing would end it otherwise). Its run "fails" by design: it is recorded,
#     not judged.
#
# Usage: vm-tests/run-crash-compare.sh [--out DIR] [--virtiofsd PATH] [--no-build]
#        vm-tests/run-crash-compare.sh --summary-only --out DIR   (summary.md again from a kept run)
# Writes OUT/{volfsd,virtiofsd}/ (the suite's output run.txt and its logs),
# OUT/cmd.txt, OUT/env.txt and OUT/summary.md (the table for the docs).
# Exit status: 0 if the volfsd side passed and the virtiofsd side was observed.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=vm-tests/runner-lib.sh
. "$HERE/runner-lib.sh"
OUT="" BUILD=1 RUN=1 ARGS="$*"
VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
die() { echo "run-crash-compare: error: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--out) OUT=${2:?}; shift ;;
	--virtiofsd) VIRTIOFSD=${2:?}; shift ;;
	--no-build) BUILD=0 ;;
	--summary-only) RUN=0 ;;
	-h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
[[ -x $VIRTIOFSD ]] || die "no virtiofsd at '$VIRTIOFSD' (bash tests/install-deps.sh installs it)"
cd "$REPO" || exit 2
((RUN && BUILD)) && { cargo build --release --quiet || die "cargo build failed"; }
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
((RUN)) || [[ -n $OUT ]] || die "--summary-only needs --out DIR"
[[ -n $OUT ]] || OUT=docs/bench-data/$(date -u +%F)-${COMMIT:0:7}-crash-compare
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if ((RUN)); then
	echo "vm-tests/run-crash-compare.sh $ARGS" >"$OUT/cmd.txt"
	compare_env "$VIRTIOFSD" "$COMMIT" "qemu" \
		"crashes: ${VMTEST_CRASHES:-20} every ${VMTEST_CRASH_INTERVAL:-2} s (volfsd); 1 (virtiofsd)" >"$OUT/env.txt"

	side() { # side NAME RUN-VM-ARGS...: the suite's output in OUT/NAME/run.txt
		local name=$1
		shift
		rm -rf "$OUT/$name"
		mkdir -p "$OUT/$name"
		echo "run-crash-compare: $name: vm-tests/run-vm.sh --vmm qemu --suite crash $*" >&2
		bash vm-tests/run-vm.sh --vmm qemu --suite crash --log-dir "$OUT/$name/logs" "$@" \
			>"$OUT/$name/run.txt" 2>&1
		echo $? >"$OUT/$name/rc"
		tail -n 1 "$OUT/$name/run.txt" >&2
	}
	side volfsd
	VMTEST_DAEMON_MAY_EXIT=1 side virtiofsd --daemon "$VIRTIOFSD" --timeout 300
fi

python3 - "$OUT" <<'PY' >"$OUT/summary.md"
import pathlib, re, sys
out = pathlib.Path(sys.argv[1])
def text(p):
    try:
        return (out / p).read_text(errors="replace")
    except OSError:
        return ""
v = text("volfsd/run.txt")
o = text("virtiofsd/logs/crash-observed.txt")
def grab(pat, s, d="?"):
    m = re.search(pat, s)
    return m.group(1) if m else d
passed = grab(r"(\d+) passed, \d+ failed", v)
failed = grab(r"\d+ passed, (\d+) failed", v)
pauses = grab(r"over (\d+) crashes: (min \d+ p50 \d+ max \d+)", v)
pm = re.search(r"over (\d+) crashes: min (\d+) p50 (\d+) max (\d+)", v)
records = grab(r"INFO (\d+) records fsynced, every one on the host", v, "0")
inflight = re.search(r"(\d+) run again, (\d+) answered EIO; the guest got (\d+) EIO", v)
rounds_after = grab(r"60 s later: metadata round \d+ \((-?\d+) rounds since the kill\)", o)
qemu = grab(r"60 s later: QEMU ([^\n]*)", o)
grown = grab(r"60 s later: the fsynced records file has \d+ bytes \((-?\d+) more since the kill\)", o)
blocked = grab(r"crash-monitor: (\d+ tasks blocked in D state for \d+ s)", o, "no hung-task report within them")
print("| after SIGKILL of the serving process | volfsd `--upgradable` | virtiofsd |")
print("|---|---|---|")
print(f"| kills | {pm.group(1) if pm else '?'}, every 2 s | 1 |")
state = "hung" if rounds_after == "0" else "went on"
print(f"| the guest's mount | kept working: the metadata loop made 2 more rounds after every kill | {state}: {rounds_after} metadata rounds in the 60 s after the kill; {blocked} |")
if pm:
    print(f"| the guest's pause per kill (ms, kill to rings running again) | min {pm.group(2)}, p50 {pm.group(3)}, max {pm.group(4)} | no end (nothing restarts the daemon) |")
print(f"| fsynced records on the host | {records} fsynced, all there | the records file grew by {grown} bytes in the 60 s after the kill |")
if inflight:
    print(f"| requests in flight at the kills | {inflight.group(1)} run again, {inflight.group(2)} answered EIO (the guest counted {inflight.group(3)}) | never answered |")
print(f"| fio with verify | no verify failure | not judged (the guest never finished) |")
print(f"| QEMU | runs on, never saw a disconnect | {qemu}; the VM must be restarted |")
print(f"| the suite | {passed} passed, {failed} failed | observed, not judged |")
print()
print("What virtiofsd's guest saw, as the hook recorded it (`crash-observed.txt`):")
print()
print("```")
print(o.strip())
print("```")
PY
cat "$OUT/summary.md"
[[ $(cat "$OUT/volfsd/rc") == 0 && -s $OUT/virtiofsd/logs/crash-observed.txt ]]
