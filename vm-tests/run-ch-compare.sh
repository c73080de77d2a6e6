#!/usr/bin/env bash
# The cloud-hypervisor scenarios against volfsd and against virtiofsd 1.14, one
# after the other, and what each guest saw, side by side (docs/MIGRATION.md and
# docs/UPGRADE.md), with the snapshot, restore and migration times of both
# (docs/BENCHMARKS.md; nested under TCG, so only their ratios mean anything).
#
#   volfsd:    run-ch.sh --group ci, as .ci/run runs it.
#   virtiofsd: run-ch.sh --group virtiofsd --daemon virtiofsd: the scenarios that
#              use nothing virtiofsd lacks (the vfs-* lines of run-ch.sh: basic and
#              fioverify with 1 and 2 request queues, snapshot and restore and the
#              clones, live migration, reconnect after a restart, crash observed as
#              run-crash-compare.sh does). Its outcome is recorded, not judged.
#
# Usage: vm-tests/run-ch-compare.sh [--out DIR] [--virtiofsd PATH] [--no-build]
#                                   [--volfsd-from LOG_DIR] [--virtiofsd-only L[,L]]
#        vm-tests/run-ch-compare.sh --summary-only --out DIR   (summary.md again)
#   --virtiofsd-only L[,L]  run only these of the virtiofsd side's scenarios (the
#                           vfs-* labels; the rest show as "not run")
#   --volfsd-from LOG_DIR   take the volfsd side from an earlier nested
#                           `run-ch.sh --group ci --log-dir LOG_DIR` (its output is
#                           LOG_DIR/l1/run.log) instead of running it again
# Writes OUT/{volfsd,virtiofsd}/ (run.txt: run-ch.sh's output; logs/), OUT/cmd.txt,
# OUT/env.txt and OUT/summary.md (the tables for the docs). Default OUT:
# docs/bench-data/DATE-COMMIT-ch-compare. Exit status: 0 if the volfsd side passed
# and the virtiofsd side ran to its end.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=vm-tests/runner-lib.sh
. "$HERE/runner-lib.sh"
OUT="" BUILD=1 RUN=1 ARGS="$*" VOLFSD_FROM="" VFS_ONLY=()
VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
die() { echo "run-ch-compare: error: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--out) OUT=${2:?}; shift ;;
	--virtiofsd) VIRTIOFSD=${2:?}; shift ;;
	--no-build) BUILD=0 ;;
	--summary-only) RUN=0 ;;
	--volfsd-from) VOLFSD_FROM=${2:?}; shift ;;
	--virtiofsd-only) VFS_ONLY=(--only "${2:?}"); shift ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option $1" ;;
	esac
	shift
done
cd "$REPO" || exit 2
((RUN)) || [[ -n $OUT ]] || die "--summary-only needs --out DIR"
if ((RUN)); then
	[[ -x $VIRTIOFSD ]] || die "no virtiofsd at '$VIRTIOFSD' (bash tests/install-deps.sh installs it)"
	((BUILD)) && { cargo build --release --quiet || die "cargo build failed"; }
fi
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[[ -n $OUT ]] || OUT=docs/bench-data/$(date -u +%F)-${COMMIT:0:7}-ch-compare
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if ((RUN)); then
	echo "vm-tests/run-ch-compare.sh $ARGS" >"$OUT/cmd.txt"
	compare_env "$VIRTIOFSD" "$COMMIT" "qemu (L1, TCG)" \
		"cloud-hypervisor: ${CH_BIN:-built by ../shared/cloud-hypervisor/build.sh ${CH_VERSION:-v53.0}}" >"$OUT/env.txt"
	side() { # side NAME RUN-CH-ARGS...
		local name=$1
		shift
		rm -rf "${OUT:?}/$name"
		mkdir -p "$OUT/$name"
		echo "run-ch-compare: $name: vm-tests/run-ch.sh $*" >&2
		bash vm-tests/run-ch.sh --log-dir "$OUT/$name/logs" "$@" >"$OUT/$name/run.txt" 2>&1
		echo $? >"$OUT/$name/rc"
		tail -n 1 "$OUT/$name/run.txt" >&2
	}
	if [[ -n $VOLFSD_FROM ]]; then
		[[ -s $VOLFSD_FROM/l1/run.log ]] || die "--volfsd-from: no $VOLFSD_FROM/l1/run.log (a nested run-ch.sh run)"
		rm -rf "${OUT:?}/volfsd"
		mkdir -p "$OUT/volfsd"
		cp -a "$VOLFSD_FROM" "$OUT/volfsd/logs"
		cp "$VOLFSD_FROM/l1/run.log" "$OUT/volfsd/run.txt"
		cp "$VOLFSD_FROM/l1/rc" "$OUT/volfsd/rc" 2>/dev/null || echo 1 >"$OUT/volfsd/rc"
		echo "run-ch-compare: volfsd: taken from $VOLFSD_FROM" >&2
	else
		side volfsd --group ci
	fi
	side virtiofsd --group virtiofsd "${VFS_ONLY[@]}" --daemon "$VIRTIOFSD"
	grep -m 1 'cloud-hypervisor v' "$OUT/volfsd/run.txt" | sed 's/^.*(\(cloud-hypervisor v[^;]*\);.*/cloud-hypervisor: \1/' >>"$OUT/env.txt"
	[[ -z $VOLFSD_FROM ]] || echo "volfsd side: taken from a run of the same commit's run-ch.sh --group ci ($VOLFSD_FROM)" >>"$OUT/env.txt"
	# The bulky parts of the logs stay out of the repository.
	find "$OUT" \( -name 'console*.log' -o -name 'dmesg.log' -o -name 'fsops-host' -o -path '*/l1/bin/*' \) -delete 2>/dev/null
fi

python3 - "$OUT" <<'PY' >"$OUT/summary.md"
import pathlib, re, sys
out = pathlib.Path(sys.argv[1])

def text(p):
    try:
        return (out / p).read_text(errors="replace")
    except OSError:
        return ""

def scenarios(side):
    """label -> (passed, failed, exit, seconds) from run-ch.sh's summary."""
    got = {}
    for m in re.finditer(r"^  (\S+)\s+(\d+) passed, (\d+) failed, exit (\d+),\s+(\d+)s", text(side + "/run.txt"), re.M):
        got[m.group(1)] = tuple(int(x) for x in m.group(2, 3, 4, 5))
    return got

def fails(side, label, n=3):
    """The first failed checks of a scenario, from its own log dir."""
    lines = []
    for f in sorted((out / side / "logs" / label / "l1").glob("run.log")) or []:
        lines += re.findall(r"VMTEST FAIL ([^\n]{0,160})", f.read_text(errors="replace"))
    if not lines:
        # The scenario's output is in run-ch.sh's run.txt, between its === lines.
        t = text(side + "/run.txt")
        m = re.search(r"^=== %s:.*?(?=^=== |\Z)" % re.escape(label), t, re.M | re.S)
        if m:
            lines = re.findall(r"VMTEST FAIL ([^\n]{0,160})", m.group(0))
    return lines[:n]

def timings(side, label):
    return text("%s/logs/%s/timings.txt" % (side, label))

v, o = scenarios("volfsd"), scenarios("virtiofsd")
rows = [
    ("basic + fio verify, 1 request queue", "basic-1q", "vfs-basic-1q"),
    ("basic + fio verify, 2 request queues", "basic-2q", "vfs-basic-2q"),
    ("shares (allowed dirs, read-only volumes), 1 / 2 queues", "shares-1q", None),
    ("control (attach, detach under a guest), 1 / 2 queues", "control-1q", None),
    ("snapshot, restore, two clones at once", "snapshot", "vfs-snapshot"),
    ("live migration (TCP, local=on twice, TCP again)", "live", "vfs-live"),
    ("reconnect: the whole daemon SIGKILLed and started again", "reconnect", "vfs-reconnect"),
    ("crash: the serving process SIGKILLed", "crash", "vfs-crash"),
    ("upgrade under the guest", "upgrade", None),
]

def cell(got, side, label):
    if label is None:
        return "not run: virtiofsd has no such feature"
    if label not in got:
        return "not run"
    p, f, rc, s = got[label]
    if f == 0 and rc == 0:
        return "%d passed, 0 failed (%d s)" % (p, s)
    why = "; ".join(fails(side, label, 2))
    return "%d passed, %d failed (%d s)%s" % (p, f, s, (": " + why.replace("|", "/")) if why else "")

print("| scenario (cloud-hypervisor, nested) | volfsd | virtiofsd 1.14 |")
print("|---|---|---|")
for name, vl, ol in rows:
    vcell = cell(v, "volfsd", vl)
    if vl in ("shares-1q", "control-1q") and vl.replace("1q", "2q") in v:
        vcell += " / " + cell(v, "volfsd", vl.replace("1q", "2q"))
    print("| %s | %s | %s |" % (name, vcell, cell(o, "virtiofsd", ol)))
print()
for side in ("volfsd", "virtiofsd"):
    for label in ("snapshot", "live", "reconnect", "vfs-snapshot", "vfs-live", "vfs-reconnect"):
        t = timings(side, label)
        if t.strip():
            print("%s %s timings:" % (side, label))
            print()
            print("```")
            print(t.strip())
            print("```")
            print()
crash = text("virtiofsd/logs/vfs-crash/crash-observed.txt")
if crash.strip():
    print("What virtiofsd's guest saw after one SIGKILL (`crash-observed.txt`):")
    print()
    print("```")
    print(crash.strip())
    print("```")
PY
cat "$OUT/summary.md"
[[ $(cat "$OUT/volfsd/rc" 2>/dev/null) == 0 && -s $OUT/virtiofsd/run.txt ]]
