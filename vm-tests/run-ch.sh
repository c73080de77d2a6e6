#!/usr/bin/env bash
# The VM suites under cloud-hypervisor (issue 34), several scenarios in one go: on
# a host without hardware KVM all of them in one L1 guest (ch-lib.sh), one boot
# of L1 for the lot; each scenario is run-vm.sh --vmm cloud-hypervisor or
# run-ch-migration.sh, run one after the other with its own logs.
#
# Usage: vm-tests/run-ch.sh [options]
#   --group G[,G]      the scenarios of these groups (default: ci; weekly: the
#                      rest; suites, moves, keeper; "all": every one but virtiofsd,
#                      the comparison's, for --daemon virtiofsd)
#   --only L[,L]       only these scenarios (labels below)
#   --daemon PATH      daemon under test (default target/release/volfsd)
#   --log-dir DIR      logs: DIR/LABEL/ for each scenario (default build/vm-logs/ch)
#   --require          fail (instead of skipping, said as such) when
#                      cloud-hypervisor cannot run a guest here (CI passes it)
#   --ch-version V     the cloud-hypervisor to build when none is given (v53.0 or
#                      main; ch-lib.sh)
#   --list             print the scenarios and exit
# Prints each scenario's output, a summary line per scenario with its wall time,
# and ends with "N passed, N failed" (the scenarios' counts summed; a scenario
# that ended without a count counts as one failure).
#
# Scenarios: LABEL GROUPS [NAME=VALUE...] SCRIPT ARGS (run-vm.sh gets --vmm
# cloud-hypervisor). The basic suite runs smaller under nesting (NFILES,
# BIG_MIB, PAR_MIB: each request crosses two levels of emulated virtualization),
# then fioverify in the same boot.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=runner-lib.sh
. "$HERE/runner-lib.sh"
# shellcheck source=ch-lib.sh
. "$HERE/ch-lib.sh"

# The basic suite's sizes nested (its checks are the same; each request crosses two
# levels of emulated virtualization): 300 files listed, 16 MiB big files, 8 MiB
# per fio job. At 1000/32/16 the CI's basic-2q alone took 11 minutes on a busy host.
SIZES="NFILES=300 BIG_MIB=16 PAR_MIB=8 FIOVERIFY_SIZE=8M"
SCENARIOS=(
	# In every CI run (group ci): the moves, and the basic suite with fio verify
	# on 2 request queues.
	"snapshot     ci,moves        run-ch-migration.sh --mode snapshot"
	"live         ci,moves        run-ch-migration.sh --mode live"
	"reconnect    ci,keeper       run-ch-migration.sh --mode reconnect"
	"basic-2q     ci,suites       $SIZES run-vm.sh --suite basic --also fioverify --queues 2 --smp 2"
	# Weekly (run-all.sh --weekly): the rest, too slow for every CI run nested.
	"basic-1q     weekly,suites   $SIZES run-vm.sh --suite basic --also fioverify --queues 1 --smp 1"
	"shares-1q    weekly,suites   run-vm.sh --suite shares --queues 1 --smp 1"
	"shares-2q    weekly,suites   run-vm.sh --suite shares --queues 2 --smp 2"
	"control-1q   weekly,suites   run-vm.sh --suite control --queues 1 --smp 1"
	"control-2q   weekly,suites   run-vm.sh --suite control --queues 2 --smp 2"
	"crash        weekly,keeper   run-vm.sh --suite crash"
	"upgrade      weekly,keeper   run-vm.sh --suite upgrade"
	# virtiofsd 1.14 (run-ch-compare.sh runs these with --daemon virtiofsd): the
	# scenarios above that use nothing virtiofsd lacks (no --allowed-dir, no
	# control socket, no --upgradable); its locks stay in the guest's kernel. Its
	# outcome is recorded, not judged: a hang is cut short by the timeouts here.
	"vfs-basic-1q     virtiofsd  $SIZES run-vm.sh --suite basic --also fioverify --queues 1 --smp 1"
	"vfs-basic-2q     virtiofsd  $SIZES run-vm.sh --suite basic --also fioverify --queues 2 --smp 2 --timeout 300"
	"vfs-snapshot     virtiofsd  run-ch-migration.sh --mode snapshot --no-host-locks"
	"vfs-live         virtiofsd  run-ch-migration.sh --mode live --no-host-locks"
	"vfs-reconnect    virtiofsd  run-ch-migration.sh --mode reconnect --no-host-locks"
	"vfs-crash        virtiofsd  VMTEST_DAEMON_MAY_EXIT=1 run-vm.sh --suite crash --timeout 300"
)

ORIG_ARGS=("$@")
GROUPS_WANTED=ci
ONLY=""
DAEMON="$REPO/target/release/volfsd"
LOG_DIR=""
REQUIRE=0
LIST=0
PASSED=0
FAILED=0

say() { echo "run-ch: $*"; }
die() {
	echo "run-ch: error: $*" >&2
	exit 2
}

while [[ $# -gt 0 ]]; do
	case "$1" in
	--group) GROUPS_WANTED=${2:?}; shift ;;
	--only) ONLY=${2:?}; shift ;;
	--daemon) DAEMON=${2:?}; shift ;;
	--log-dir) LOG_DIR=${2:?}; shift ;;
	--require) REQUIRE=1 ;;
	--ch-version) CH_VERSION=${2:?}; shift ;;
	--list) LIST=1 ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option: $1" ;;
	esac
	shift
done
LOG_DIR=$(realpath -m "${LOG_DIR:-$REPO/build/vm-logs/ch}")

# The scenarios chosen, one line each.
chosen() {
	local entry label groups g
	for entry in "${SCENARIOS[@]}"; do
		read -r label groups _ <<<"$entry"
		if [[ -n $ONLY ]]; then
			[[ ,$ONLY, == *,$label,* ]] && echo "$entry"
			continue
		fi
		for g in ${GROUPS_WANTED//,/ }; do
			if [[ ($g == all && ,$groups, != *,virtiofsd,*) || ,$groups, == *,$g,* ]]; then
				echo "$entry"
				break
			fi
		done
	done
}

mapfile -t RUN < <(chosen)
if [[ $LIST == 1 ]]; then
	printf '%s\n' "${SCENARIOS[@]}"
	exit 0
fi
((${#RUN[@]} > 0)) || die "no scenario in group(s) '$GROUPS_WANTED'${ONLY:+ / only '$ONLY'} (--list shows them)"
[[ -x $DAEMON ]] || die "daemon '$DAEMON' is not an executable (cargo build --release, or pass --daemon)"
DAEMON=$(readlink -f "$DAEMON")

trap l1_stop EXIT
trap 'exit 130' INT TERM
ch_setup "$REQUIRE"
mkdir -p "$LOG_DIR"
if [[ $CH_MODE == nested ]]; then
	"$HERE/build-guest.sh" --quiet >/dev/null || die "build-guest.sh failed"
	t0=$SECONDS
	say "${#RUN[@]} scenario(s) in one L1 guest: $(for e in "${RUN[@]}"; do read -r l _ <<<"$e"; printf '%s ' "$l"; done)"
	# Up to three 512 MiB guests at once (the clones), a snapshot and copies.
	ch_nested_exec "$LOG_DIR" 4096 "$L1_SMP" $((2400 * ${#RUN[@]})) "$0" "${ORIG_ARGS[@]}" \
		--daemon "$(l1_visible "$DAEMON" "$LOG_DIR")" --log-dir "$LOG_DIR"
	say "all scenarios took $((SECONDS - t0)) s (nested, L1 boot included)"
	echo "$PASSED passed, $FAILED failed"
	[[ $FAILED == 0 ]]
	exit
fi

summary=()
t_all=$SECONDS
for entry in "${RUN[@]}"; do
	read -r label _ rest <<<"$entry"
	envs=()
	while [[ $rest =~ ^([A-Z_][A-Z0-9_]*=[^ ]*)\ +(.*)$ ]]; do
		envs+=("${BASH_REMATCH[1]}")
		rest=${BASH_REMATCH[2]}
	done
	read -r script args <<<"$rest"
	extra=(--daemon "$DAEMON" --log-dir "$LOG_DIR/$label")
	[[ $script != run-vm.sh ]] || extra+=(--vmm cloud-hypervisor --prebuilt-guest)
	((REQUIRE == 0)) || extra+=(--require)
	echo "=== $label: ${envs[*]} $script $args"
	t0=$SECONDS
	log=$(mktemp)
	rc=0
	# shellcheck disable=SC2086 # args is a word list by design
	env "${envs[@]}" "$HERE/$script" $args "${extra[@]}" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1 || true)
	rm -f "$log"
	p=0 f=0
	if [[ -n $counts ]]; then
		p=${counts%% passed*}
		f=${counts#*, }
		f=${f%% failed*}
	fi
	if [[ $rc != 0 && $f == 0 ]]; then
		f=1
		echo "  VMTEST FAIL $label: $script exited with status $rc without a failure counted"
	fi
	PASSED=$((PASSED + p))
	FAILED=$((FAILED + f))
	summary+=("$(printf '%-12s %3s passed, %s failed, exit %s, %4ss' "$label" "$p" "$f" "$rc" $((SECONDS - t0)))")
done
echo "=== cloud-hypervisor scenarios ($((SECONDS - t_all)) s, $CH_VERSION_TEXT)"
printf '  %s\n' "${summary[@]}"
echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
