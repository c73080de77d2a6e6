#!/usr/bin/env bash
# volfsd demo, from a fresh Debian machine (run as root):
#   1. installs what it needs (apt packages; Rust via the system's rustup/cargo)
#   2. builds volfsd (cargo build --release)
#   3. builds the test guest (kernel + initramfs)
#   4. boots a VM with a virtio-fs share served by volfsd, where the guest reads
#      a file the host created and writes one of its own
#   5. shows the guest's file from the host
#
# Usage: vm-tests/demo.sh [--daemon PATH]   (PATH: use another daemon, e.g. virtiofsd)
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
DAEMON=""
SHARE=""

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { echo "demo: error: $*" >&2; exit 1; }
cleanup() { [[ -z $SHARE ]] || rm -rf "$SHARE"; }

while [[ $# -gt 0 ]]; do
	case "$1" in
	--daemon) DAEMON=${2:?}; shift ;;
	-h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option: $1" ;;
	esac
	shift
done

install_packages() {
	local missing=() p
	for p in qemu-system-x86 busybox-static fio cpio gcc libc6-dev; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [[ ${#missing[@]} -eq 0 ]]; then
		echo "all needed packages are installed"
		return
	fi
	[[ $(id -u) == 0 ]] || die "need root to install: ${missing[*]}"
	echo "installing: ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}

build_volfsd() {
	command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain first"
	(cd "$REPO" && cargo build --release)
	DAEMON="$REPO/target/release/volfsd"
}

main() {
	trap cleanup EXIT
	step "Installing host packages"
	install_packages

	if [[ -z $DAEMON ]]; then
		step "Building volfsd (cargo build --release)"
		build_volfsd
	fi
	[[ -x $DAEMON ]] || die "daemon '$DAEMON' is not executable"

	step "Building the test guest (cached after the first run)"
	"$HERE/build-guest.sh" --without-pjdfstest

	SHARE=$(mktemp -d /tmp/volfsd-demo.XXXXXX)
	echo "hello from the host" >"$SHARE/hello-from-host.txt"
	step "Booting a VM sharing $SHARE through $(basename "$DAEMON")"
	echo "host wrote hello-from-host.txt: $(cat "$SHARE/hello-from-host.txt")"
	local out rc=0
	out=$("$HERE/run-vm.sh" --prebuilt-guest --daemon "$DAEMON" --suite demo --shared-dir "$SHARE" --timeout 300 2>&1) || rc=$?
	# Show the guest's own words, then the verdicts.
	grep -E '^  VMTEST INFO guest ' <<<"$out" | sed 's/^  VMTEST INFO /  /' || true
	grep -E '^  VMTEST (PASS|FAIL) |^run-vm: (guest|booting)|^[0-9]+ passed' <<<"$out" || true
	if [[ $rc != 0 ]]; then
		echo "$out" | tail -n 40
		die "the VM run failed (exit $rc); logs are in $REPO/build/vm-logs/demo"
	fi

	step "The host sees the file the guest wrote"
	ls -l "$SHARE"
	echo "hello-from-guest.txt: $(cat "$SHARE/hello-from-guest.txt")"

	step "Demo finished: volfsd served a VM's virtio-fs share both ways"
}

main
