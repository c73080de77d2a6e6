# What the VM runners (run-vm.sh, run-unprivileged.sh, run-libvirt.sh) share:
# counting results, reading the guest's serial results, showing a log's tail,
# installing missing packages, stopping a process. Sourced; the runner defines
# say and die (their messages carry its name) and PASSED/FAILED.

# result_line "VMTEST PASS|FAIL ...": print it and count it
result_line() {
	case "$1" in
	"VMTEST PASS "*) PASSED=$((PASSED + 1)) ;;
	"VMTEST FAIL "*) FAILED=$((FAILED + 1)) ;;
	esac
	echo "  $1"
}
pass() { result_line "VMTEST PASS $1"; }
fail() { result_line "VMTEST FAIL $1: $2"; }

# serial_results SERIAL_LOG: the guest's VMTEST lines so far
serial_results() { tr -d '\r' <"$1" 2>/dev/null | grep -a '^VMTEST ' || true; }

show_tail() { # show_tail FILE TITLE
	[[ -s $1 ]] || return 0
	echo "---- last lines of $2 ($1) ----"
	tail -n 25 "$1" | tr -d '\r' | sed 's/^/  | /'
}

# ensure_packages [--no-install-recommends] PACKAGE...: apt-get installs the
# missing ones (root only; otherwise it dies naming them)
ensure_packages() {
	local opts=() missing=() p
	if [[ ${1:-} == --no-install-recommends ]]; then
		opts=(--no-install-recommends)
		shift
	fi
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[[ ${#missing[@]} -eq 0 ]] && return 0
	[[ $(id -u) == 0 ]] || die "missing packages: ${missing[*]} (run as root to install them)"
	say "installing ${missing[*]}"
	apt-get update -qq || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "${missing[@]}" ||
		die "apt-get install ${missing[*]} failed"
}

stop_pid() { # stop_pid PID [SECONDS]: TERM, then KILL after SECONDS (default 5)
	local pid=$1 tenths=$((${2:-5} * 10)) i
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq "$tenths"); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# compare_env VIRTIOFSD COMMIT QEMU_LABEL [LINE...]: the env.txt of a side-by-side
# comparison (run-ch-compare.sh, run-crash-compare.sh) on standard output: date,
# commit, host, the two daemons' versions, then the comparison's own lines. Run
# from the repository's top.
compare_env() {
	local virtiofsd=$1 commit=$2 qemu_label=$3
	shift 3
	echo "date: $(date -u +%FT%TZ)"
	echo "commit: $commit$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
	echo "host_kernel: $(uname -r)"
	echo "cores: $(nproc)"
	echo "$qemu_label: $(qemu-system-x86_64 --version | head -n 1)"
	echo "volfsd: $(target/release/volfsd --version 2>&1 | head -n 1)"
	echo "virtiofsd: $("$virtiofsd" --version 2>&1 | head -n 1)"
	local line
	for line in "$@"; do echo "$line"; done
}

# clone_share_checks SUM WHO SUB SHARE COPY...: after clones of one snapshot ran
# on copies of the share (COPY ends in copyN: cloneN), each side's SUB directory
# holds only its own written-by-* file (WHO: the side on SHARE), and SHARE's files
# still hash to SUM (the clones left it alone).
clone_share_checks() {
	local sum=$1 original=$2 sub=$3 share=$4 d who written
	shift 4
	for d in "$share" "$@"; do
		case $d in "$share") who=$original ;; *) who=clone${d##*copy} ;; esac
		written=$(find "$d/$sub" -maxdepth 1 -name 'written-by-*' -printf '%f ' | sort)
		if [[ $written == "written-by-$who " ]]; then
			pass "$who/host-writes-in-own-share-only"
		else
			fail "$who/host-writes-in-own-share-only" "$d/$sub has: ${written:-nothing}"
		fi
	done
	if [[ $(cd "$share" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum) == "$sum" ]]; then
		pass "$original/host-share-untouched-by-clones"
	else
		fail "$original/host-share-untouched-by-clones" "the share changed while the clones ran"
	fi
}
