#!/usr/bin/env bash
# Builds the volfsd Debian package with cargo-deb and prints the .deb's path as its
# last line.
#   1. installs cargo-deb if missing (cargo install cargo-deb --locked), and
#      dpkg-dev for `depends = "$auto"` (dpkg-shlibdeps)
#   2. builds the release binary (cargo build --release --locked)
#   3. writes the man page and shell completions from the clap definitions into
#      target/packaging/ (cargo run -p volfsd-docgen), gzips the man page
#   4. cargo deb --no-build --locked: packs the binary built in step 2 with the
#      assets listed in Cargo.toml's [package.metadata.deb]
#
# Usage: packaging/build-deb.sh
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
OUT=$REPO/target/packaging

step() { printf '\n\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { echo "build-deb: error: $*" >&2; exit 1; }

command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain first"

# The version the package was checked with: a new release changes its flags.
CARGO_DEB_VERSION=3.8.0
if [[ $(cargo deb --version 2>/dev/null) != *"$CARGO_DEB_VERSION"* ]]; then
	step "Installing cargo-deb $CARGO_DEB_VERSION (cargo install cargo-deb --locked)"
	start=$SECONDS
	cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked >&2 || die "cargo install cargo-deb failed"
	echo "build-deb: cargo-deb installed in $((SECONDS - start)) s" >&2
fi
if ! command -v dpkg-shlibdeps >/dev/null; then
	step "Installing dpkg-dev (dpkg-shlibdeps, for the package's Depends)"
	[[ $(id -u) == 0 ]] || die "need root to install dpkg-dev"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends dpkg-dev >&2
fi

step "Building volfsd (cargo build --release --locked)"
cargo build --release --locked >&2

step "Generating the man page and completions into target/packaging"
rm -rf "$OUT"
cargo run --quiet --locked -p volfsd-docgen -- "$OUT" >&2
gzip -9 -n -f "$OUT"/*.1

step "Packing (cargo deb --no-build --locked)"
# cargo-deb prints the .deb's path on stdout.
deb=$(cargo deb -p volfsd --no-build --locked | tail -n 1)
[[ -f $deb ]] || die "cargo deb did not produce a package (got '$deb')"
echo "$deb"
