#!/usr/bin/env bash
# Runs every check of volfsd on this machine: format, lint, host tests, and the VM
# suites (a real Linux guest under QEMU). Installs what it needs first.
# Ends with one line "N passed, N failed"; exits non-zero if anything failed.
#
# Usage: tests/run.sh [--no-vm] [--require-cloud-hypervisor]
#   --no-vm    skips the VM suites and the smoke's guest run
#   --require-cloud-hypervisor   (.ci/run) the cloud-hypervisor suites must run:
#              without a cloud-hypervisor (or a way to KVM) they fail, saying why,
#              instead of being skipped (said as such)
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
RUN_VM=1
CH_REQUIRE=()
for arg in "$@"; do
	case "$arg" in
	--no-vm) RUN_VM=0 ;;
	--require-cloud-hypervisor) CH_REQUIRE=(--require) ;;
	*) echo "tests/run.sh: unknown option: $arg" >&2; exit 2 ;;
	esac
done

passed=0
failed=0
report=()

# Each stage's header says when it started (seconds into the run): the CI log then
# shows what each stage cost.
stage() { printf '\n\033[1m==> %s\033[0m (at %d s)\n' "$*" "$SECONDS"; }
record() { # name status(0/1) [count_pass count_fail]
	local name=$1 rc=$2 p=${3:-} f=${4:-}
	if [[ -z $p ]]; then
		if [[ $rc == 0 ]]; then p=1 f=0; else p=0 f=1; fi
	fi
	[[ $rc != 0 && $f == 0 ]] && f=1
	passed=$((passed + p))
	failed=$((failed + f))
	report+=("$(printf '%-28s %5s passed %5s failed' "$name" "$p" "$f")")
}

stage "install dependencies"
if ! bash tests/install-deps.sh; then
	echo "dependencies could not be installed" >&2
	echo "0 passed, 1 failed"
	exit 1
fi

# cloud-hypervisor and its VM suites, in the background. Its build (from its source
# once per machine: about 4 minutes of both cores the first time; or found: CH_BIN,
# PATH) starts now, beside the host stages: its suites, the longest stage, wait for
# it, so it must be done when those stages are (at the lowest priority it got little
# CPU before the QEMU suites and would hold its suites back on a fresh machine).
# Its suites (nested under QEMU TCG here: one core) wait for the go of the VM stage
# and run beside the QEMU suites (one core most of the time): the two together take
# about as long as the QEMU suites alone took with the other core idle. Each has
# its own log, printed as its own stage after the QEMU suites.
if [[ $RUN_VM == 1 ]]; then
	ch_dir=$(mktemp -d)
	t_ch=$SECONDS
	ch_all=()
	[[ ${#CH_REQUIRE[@]} == 0 ]] || ch_all=(--require-cloud-hypervisor)
	(
		t0=$SECONDS
		bash vm-tests/ch-build.sh "${CH_REQUIRE[@]}" >"$ch_dir/build.log" 2>&1
		echo $? >"$ch_dir/build.rc"
		echo $((SECONDS - t0)) >"$ch_dir/build.seconds"
		until [[ -e $ch_dir/go ]]; do sleep 2; done
		t0=$SECONDS
		bash vm-tests/run-all.sh --daemon "$REPO/target/release/volfsd" --only cloud-hypervisor \
			"${ch_all[@]}" >"$ch_dir/suites.log" 2>&1
		echo $? >"$ch_dir/suites.rc"
		echo $((SECONDS - t0)) >"$ch_dir/suites.seconds"
	) &
	ch_pid=$!
fi

stage "cargo fmt --check"
cargo fmt --all -- --check
record "cargo fmt" $?

stage "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
record "cargo clippy" $?

stage "cargo build --release --workspace"
cargo build --release --locked --workspace
rc=$?
record "cargo build --release" $rc

# Runs cargo test commands and records the sum of their "test result:" counts.
cargo_counted() { # name command...
	local name=$1 log rc p f
	shift
	log=$(mktemp)
	"$@" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	p=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^passed/) s += $i } END { print s + 0 }' "$log")
	f=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^failed/) s += $i } END { print s + 0 }' "$log")
	rm -f "$log"
	record "$name" "$rc" "${p:-0}" "${f:-0}"
}

stage "cargo test --workspace"
# The harness's tests run target/debug/volfsd (see harness/src/fixtures/mod.rs): build
# the binaries first, cargo test only builds those of a package with tests/.
# --no-fail-fast: one failing test binary must not hide how the ones after it fare.
cargo_counted "cargo test" bash -c 'cargo build --locked --workspace --bins && cargo test --locked --workspace --no-fail-fast'

# The hostile-guest suite again in the other sandbox modes (the run above used the
# default, namespace): confinement must not be what keeps the guest in.
for mode in chroot none; do
	stage "hostile-guest suite, --sandbox $mode"
	cargo_counted "hostile suite ($mode)" \
		env VOLFSD_TEST_SANDBOX=$mode cargo test --locked -p volfsd-harness --test hostile_guest
done

# The guest-facing suites again with nodes kept by file handle instead of O_PATH fds.
for suite in hostile_guest fs_ops; do
	stage "$suite suite, --inode-file-handles prefer"
	cargo_counted "$suite (file handles)" \
		env VOLFSD_TEST_FILE_HANDLES=prefer cargo test --locked -p volfsd-harness --test $suite
done

# Runs a script that ends with "N passed, N failed" and records its counts.
run_counted() { # name command...
	local name=$1 log rc counts p f
	shift
	log=$(mktemp)
	"$@" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
	rm -f "$log"
	p=${counts%% passed*}
	f=${counts#*, }
	f=${f%% failed*}
	record "$name" "$rc" "${p:-0}" "${f:-0}"
}

# A log's "N passed, N failed" recorded under NAME with the exit status in RC_FILE.
record_log() { # name log rc_file
	local counts p f
	counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$2" | tail -n 1)
	p=${counts%% passed*}
	f=${counts#*, }
	f=${f%% failed*}
	record "$1" "$(cat "$3" 2>/dev/null || echo 1)" "${p:-0}" "${f:-0}"
}

if [[ $RUN_VM == 1 ]]; then
	# The guest both VMMs boot, built once before either starts (cached).
	stage "test guest (vm-tests/build-guest.sh)"
	bash vm-tests/build-guest.sh --quiet >/dev/null
	record "test guest build" $?
	: >"$ch_dir/go"
	stage "VM suites under QEMU (vm-tests/run-all.sh --except cloud-hypervisor; the cloud-hypervisor suites run beside them from $SECONDS s)"
	run_counted "VM suites (QEMU)" bash vm-tests/run-all.sh --daemon "$REPO/target/release/volfsd" \
		--except cloud-hypervisor
	wait "$ch_pid"
	stage "cloud-hypervisor build (vm-tests/ch-build.sh, in the background from $t_ch s)"
	cat "$ch_dir/build.log"
	record_log "cloud-hypervisor build" "$ch_dir/build.log" "$ch_dir/build.rc"
	echo "cloud-hypervisor build stage: $(cat "$ch_dir/build.seconds" 2>/dev/null || echo '?') s"
	stage "VM suites under cloud-hypervisor (vm-tests/run-all.sh --only cloud-hypervisor, beside the QEMU suites)"
	cat "$ch_dir/suites.log"
	record_log "VM suites (cloud-hypervisor)" "$ch_dir/suites.log" "$ch_dir/suites.rc"
	echo "cloud-hypervisor suites stage: $(cat "$ch_dir/suites.seconds" 2>/dev/null || echo '?') s"
	rm -rf "$ch_dir"
fi

# Builds the Debian package, installs it, checks what it installed and runs the
# demo with /usr/bin/volfsd (packaging/README.md).
if [[ $RUN_VM == 1 ]]; then
	stage "Debian package (tests/package.sh)"
	run_counted "package" bash tests/package.sh
fi

stage "performance instruments smoke (benches/smoke.sh)"
smoke_args=(--no-build)
[[ $RUN_VM == 0 ]] && smoke_args+=(--skip-vm)
run_counted "benchmark smoke" bash benches/smoke.sh "${smoke_args[@]}"

# Replays the fuzz corpora and regressions, then fuzzes each target briefly (AFL++
# through cargo-afl, installed on first use; see fuzz/README.md).
stage "fuzzing (fuzz/run.sh --ci)"
# 25 s per target (fuzz/run.sh --ci: two at a time): the CI run stays under 40
# minutes with the cloud-hypervisor suites; longer runs are fuzz/run.sh TARGET.
run_counted "fuzzing" env FUZZ_SECONDS=25 bash fuzz/run.sh --ci

stage "summary"
printf '%s\n' "${report[@]}"
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
