#!/usr/bin/env bash
# Builds and runs volfsd's AFL++ fuzz targets (cargo-afl, stable Rust). Installs
# cargo-afl (and the AFL++ it builds) when missing. Needs root (the targets mount
# share clones with open_tree).
#
# Usage:
#   fuzz/run.sh --ci                 replay the corpora and regressions, then fuzz each
#                                    target for $FUZZ_SECONDS (default 45) s, two at a
#                                    time; fails on a build failure, a failing replay or
#                                    any crash; ends with "N passed, N failed"
#   fuzz/run.sh --campaign MINUTES   fuzz each target MINUTES minutes (two at a time) and
#                                    write out/campaign-<time>/summary.md (execs, edges,
#                                    coverage, crashes, hangs per target)
#   fuzz/run.sh --replay             only the replay tests (corpora + regressions)
#   fuzz/run.sh --build              only install and build
#   --target NAME                    restrict to one target (repeatable): fuse,
#                                    virtqueue, control, paths, state, region
#
# Environment: FUZZ_SECONDS (--ci per-target time), VOLFSD_FUZZ_TARGET_DIR (cargo
# target dir, default /var/tmp/volfsd-fuzz-target, kept between runs so a second
# run builds incrementally), FUZZ_JOBS (targets fuzzed at once, default 2),
# VOLFSD_FUZZ_SKIP_OPEN=1 (virtqueue skips inputs virtio-queue finds invalid, the
# class of a finding while it was open; see regressions/README.md).
set -uo pipefail

FUZZ_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$FUZZ_DIR"
ALL_TARGETS=(fuse virtqueue control paths state region)
AFL_VERSION=0.18.2
export CARGO_TARGET_DIR=${VOLFSD_FUZZ_TARGET_DIR:-/var/tmp/volfsd-fuzz-target}
export PATH="$HOME/.cargo/bin:$PATH"
SECONDS_PER_TARGET=${FUZZ_SECONDS:-45}
JOBS=${FUZZ_JOBS:-2}

mode=""
minutes=0
targets=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--ci) mode=ci ;;
	--campaign)
		mode=campaign
		minutes=${2:?--campaign needs MINUTES}
		shift
		;;
	--replay) mode=replay ;;
	--build) mode=build ;;
	--target)
		targets+=("${2:?--target needs NAME}")
		shift
		;;
	-h | --help)
		sed -n '2,22p' "$0"
		exit 0
		;;
	*)
		echo "unknown argument: $1" >&2
		exit 2
		;;
	esac
	shift
done
[[ -n $mode ]] || {
	sed -n '2,22p' "$0"
	exit 2
}
[[ ${#targets[@]} -gt 0 ]] || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
	[[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || {
		echo "unknown target: $t" >&2
		exit 2
	}
done

passed=0
failed=0
lines=()
result() { # name ok(0/1) text
	if [[ $2 == 0 ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
	lines+=("$(printf '%-22s %-4s %s' "$1" "$([[ $2 == 0 ]] && echo ok || echo FAIL)" "$3")")
}
finish() {
	echo
	printf '%s\n' "${lines[@]}"
	echo "$passed passed, $failed failed"
	[[ $failed == 0 ]]
	exit $?
}

# --- install ---------------------------------------------------------------------
# cargo-afl builds AFL++ (afl-fuzz and its LLVM runtime) for the current rustc into
# ~/.local/share/afl.rs/rustc-<version>-<hash>/afl.rs-<version>/ when installed, and
# `cargo afl config --build` rebuilds it after a rustc upgrade.
afl_ready() {
	command -v cargo-afl >/dev/null || return 1
	[[ $(cargo afl --version 2>/dev/null) == *"cargo-afl $AFL_VERSION "* ]] || return 1
	local rv
	rv=$(rustc -vV | awk '/^release:/ {r=$2} /^commit-hash:/ {h=substr($2,1,7)} END {print "rustc-" r "-" h}')
	[[ -x $HOME/.local/share/afl.rs/$rv/afl.rs-$AFL_VERSION/afl/bin/afl-fuzz ]]
}

install_afl() {
	if afl_ready; then
		return 0
	fi
	if ! command -v cargo-afl >/dev/null ||
		[[ $(cargo afl --version 2>/dev/null) != *"cargo-afl $AFL_VERSION "* ]]; then
		echo "==> cargo install cargo-afl $AFL_VERSION (builds AFL++)"
		cargo install cargo-afl --version "$AFL_VERSION" --locked --force || return 1
	fi
	if ! afl_ready; then
		echo "==> cargo afl config --build (AFL++ for $(rustc --version))"
		cargo afl config --build --force || return 1
	fi
	afl_ready
}

build() {
	echo "==> cargo afl build (target dir $CARGO_TARGET_DIR)"
	cargo afl build --release --features afl --bins
}

replay() {
	echo "==> replay: corpora and regressions, and the oracles' own tests (cargo afl test)"
	local log rc
	log=$(mktemp)
	cargo afl test --release --features afl --test replay --test oracles 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	local p f
	p=$(awk '/^test result:/ {for (i = 1; i <= NF; i++) if ($(i+1) ~ /^passed/) s += $i} END {print s + 0}' "$log")
	f=$(awk '/^test result:/ {for (i = 1; i <= NF; i++) if ($(i+1) ~ /^failed/) s += $i} END {print s + 0}' "$log")
	rm -f "$log"
	result "replay" "$rc" "$p replay tests passed, $f failed (every corpus and regressions file)"
	return "$rc"
}

# --- fuzzing -----------------------------------------------------------------------
stat_of() { # file key
	awk -F' *: *' -v k="$2" '$1 == k {print $2}' "$1" 2>/dev/null
}

# Per-target AFL timeout (ms): above the targets' own 2 s watchdogs, so a call that
# does not return is recorded as a crash (the watchdog's abort), not a hang.
timeout_of() {
	case $1 in
	fuse | virtqueue) echo 5000 ;;
	*) echo 1000 ;;
	esac
}

fuzz_one() { # target seconds outdir
	local t=$1 secs=$2 out=$3
	rm -rf "$out"
	mkdir -p "$out"
	AFL_SKIP_CPUFREQ=1 \
		AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
		AFL_NO_UI=1 \
		AFL_NO_AFFINITY=1 \
		AFL_FAST_CAL=1 \
		AFL_NO_STARTUP_CALIBRATION=1 \
		timeout -k 10 $((secs + 180)) \
		cargo afl fuzz -V "$secs" -t "$(timeout_of "$t")" -i "corpus/$t" -o "$out" \
		"$CARGO_TARGET_DIR/release/fuzz_$t" >"$out/afl.log" 2>&1
	echo $? >"$out/rc"
}

report_one() { # target outdir -> sets REPORT_TEXT, returns 0 when clean
	local t=$1 out=$2 stats rc
	stats="$out/default/fuzzer_stats"
	rc=$(cat "$out/rc" 2>/dev/null || echo 1)
	if [[ ! -f $stats ]]; then
		REPORT_TEXT="afl-fuzz did not start (rc $rc): $(grep -a 'PROGRAM ABORT' -A1 "$out/afl.log" | tr -s ' \n' ' ' | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200)"
		return 1
	fi
	local execs eps edges total cvg crashes hangs corpus stab
	execs=$(stat_of "$stats" execs_done)
	eps=$(stat_of "$stats" execs_per_sec)
	edges=$(stat_of "$stats" edges_found)
	total=$(stat_of "$stats" total_edges)
	cvg=$(stat_of "$stats" bitmap_cvg)
	crashes=$(stat_of "$stats" saved_crashes)
	hangs=$(stat_of "$stats" saved_hangs)
	corpus=$(stat_of "$stats" corpus_count)
	stab=$(stat_of "$stats" stability)
	REPORT_TEXT="execs $execs (${eps}/s), edges $edges/$total ($cvg), corpus $corpus, stability $stab, crashes $crashes, hangs $hangs"
	[[ ${crashes:-1} == 0 && $rc == 0 ]]
}

# Runs the targets, $JOBS at a time.
fuzz_all() { # seconds outroot
	local secs=$1 root=$2 t running=()
	for t in "${targets[@]}"; do
		echo "==> fuzzing $t for ${secs}s -> $root/$t"
		fuzz_one "$t" "$secs" "$root/$t" &
		running+=($!)
		if [[ ${#running[@]} -ge $JOBS ]]; then
			wait "${running[0]}"
			running=("${running[@]:1}")
		fi
	done
	wait
}

# The panic message or watchdog line of a crash input (run once, outside AFL).
why_crash() { # target file
	timeout 30 "$CARGO_TARGET_DIR/release/fuzz_$1" <"$2" 2>&1 | grep -a -m1 -A1 -E 'panicked|watchdog'
}

crash_list() { # outdir
	find "$1/default/crashes" -type f -name 'id:*' 2>/dev/null | sort
}

# --- modes -------------------------------------------------------------------------
if ! install_afl; then
	result "install cargo-afl" 1 "cargo install cargo-afl / cargo afl config --build failed"
	finish
fi
if ! build; then
	result "build" 1 "cargo afl build failed"
	finish
fi
[[ $mode == build ]] && exit 0

case $mode in
replay)
	replay
	finish
	;;
ci)
	replay
	root="$FUZZ_DIR/out/ci"
	fuzz_all "$SECONDS_PER_TARGET" "$root"
	for t in "${targets[@]}"; do
		if report_one "$t" "$root/$t"; then
			result "fuzz $t" 0 "$REPORT_TEXT"
		else
			result "fuzz $t" 1 "$REPORT_TEXT"
			for c in $(crash_list "$root/$t"); do
				echo "crash in $t: $c"
				why_crash "$t" "$c" | sed "s/^/    /"
			done
		fi
	done
	finish
	;;
campaign)
	stamp=$(date -u +%Y%m%dT%H%M%SZ)
	rev=$(git -C "$FUZZ_DIR/.." describe --always --dirty 2>/dev/null)
	root="$FUZZ_DIR/out/campaign-$stamp"
	fuzz_all $((minutes * 60)) "$root"
	summary="$root/summary.md"
	{
		echo "# volfsd fuzz campaign $stamp"
		echo
		echo "volfsd $rev (at the start), $(rustc --version), cargo-afl $AFL_VERSION, $(nproc) cores, $JOBS targets at a time, $minutes min per target"
		echo
		echo "| target | run time s | execs | execs/s | edges found / total | bitmap coverage | corpus | stability | crashes | hangs |"
		echo "|---|---|---|---|---|---|---|---|---|---|"
		for t in "${targets[@]}"; do
			s="$root/$t/default/fuzzer_stats"
			echo "| $t | $(stat_of "$s" run_time) | $(stat_of "$s" execs_done) | $(stat_of "$s" execs_per_sec) | $(stat_of "$s" edges_found) / $(stat_of "$s" total_edges) | $(stat_of "$s" bitmap_cvg) | $(stat_of "$s" corpus_count) | $(stat_of "$s" stability) | $(stat_of "$s" saved_crashes) | $(stat_of "$s" saved_hangs) |"
		done
		echo
		for t in "${targets[@]}"; do
			list=$(crash_list "$root/$t")
			[[ -z $list ]] && continue
			echo "## crashes of $t"
			echo
			for c in $list; do
				why=$(why_crash "$t" "$c" | tr '\n' ' ')
				echo "- \`${c#"$FUZZ_DIR"/}\`: $why"
			done
			echo
		done
	} >"$summary"
	cat "$summary"
	for t in "${targets[@]}"; do
		if report_one "$t" "$root/$t"; then
			result "fuzz $t" 0 "$REPORT_TEXT"
		else
			result "fuzz $t" 1 "$REPORT_TEXT"
		fi
	done
	echo "summary: $summary"
	finish
	;;
esac
