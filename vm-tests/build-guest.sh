#!/usr/bin/env bash
# Assemble the test guest for the volfsd VM tests into build/guest/:
#   vmlinuz            Debian's 6.12 amd64 kernel (virtio-pci, fuse and virtiofs built in)
#   vmlinux            the same kernel as an ELF with a PVH entry, for cloud-hypervisor
#   initramfs.cpio.gz  busybox-static, fio (+ its shared libraries), the fsops
#                      helper, pjdfstest (+ its shared libraries), git,
#                      sqlite3 and GNU tar (as gtar; each with its shared
#                      libraries; the workloads suite), the kernel's
#                      virtio_blk module (the workloads suite's inputs), the guest
#                      init, vm-tests/guest/lib.sh, the backend gap table
#                      (guest/backend-gaps) and the guest suites
#                      (vm-tests/suites/*.sh, minus *.host.sh / *.hook.sh /
#                      *.setup.sh)
#
# pjdfstest (the Rust rewrite, crate pjdfstest $PJDFSTEST_VERSION) is built
# once with `cargo install --locked` from crates.io into
# build/pjdfstest/VERSION/ and reused; if it cannot be built the guest is
# built without it (a warning; the pjdfstest suite then fails).
#
# The result is cached: it is rebuilt only when an input file or a package
# version changes (all hashed into build/guest/stamp). Prints the paths.
# --without-pjdfstest (the demo, which never runs it): a guest built already,
# with or without pjdfstest, is taken as it is when its other inputs are
# unchanged; otherwise one is built without pjdfstest (and without building it:
# minutes on a fresh machine). The next build for the suites puts it back.
#
# Usage: vm-tests/build-guest.sh [--force] [--quiet] [--without-pjdfstest]
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUT="$REPO/build/guest"
FORCE=0
QUIET=0
WITH_PJDFSTEST=1
PJDFSTEST_VERSION=0.2.2
PJDFSTEST_DIR="$REPO/build/pjdfstest/$PJDFSTEST_VERSION"
TMP=""
# Debian packages whose binaries go into the guest (their versions are in the
# stamp): busybox, fio, the compiler of fsops, and git, sqlite3 and GNU tar for
# the workloads suite.
GUEST_PACKAGES="busybox-static fio gcc libc6-dev git sqlite3 tar xz-utils"

log() { [[ $QUIET == 1 ]] || echo "build-guest: $*" >&2; }
die() { echo "build-guest: error: $*" >&2; exit 1; }

parse_args() {
	while [[ $# -gt 0 ]]; do
		case "$1" in
		--force) FORCE=1 ;;
		--quiet) QUIET=1 ;;
		--without-pjdfstest) WITH_PJDFSTEST=0 ;;
		-h | --help) sed -n '2,24p' "$0"; exit 0 ;;
		*) die "unknown option: $1" ;;
		esac
		shift
	done
}

APT_UPDATED=0
apt_update_once() {
	if [[ $APT_UPDATED == 0 ]]; then
		log "apt-get update"
		apt-get update -qq >&2 || die "apt-get update failed"
		APT_UPDATED=1
	fi
}

# Install the Debian packages the guest is built from, if missing (CI starts
# from a fresh machine as root).
ensure_packages() {
	local missing=() p
	for p in $GUEST_PACKAGES cpio gzip zstd; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [[ ${#missing[@]} -gt 0 ]]; then
		[[ $(id -u) == 0 ]] || die "missing packages (${missing[*]}) and not root to install them"
		apt_update_once
		log "installing ${missing[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 ||
			die "apt-get install ${missing[*]} failed"
	fi
}

# Newest linux-image-6.12.*+deb12-amd64-unsigned (not cloud, not rt).
kernel_package() {
	local re='^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$' pkg
	pkg=$(apt-cache search --names-only "$re" | awk '{print $1}' | sort -V | tail -n 1)
	if [[ -z $pkg ]]; then
		apt_update_once
		pkg=$(apt-cache search --names-only "$re" | awk '{print $1}' | sort -V | tail -n 1)
	fi
	[[ -n $pkg ]] || die "no linux-image-6.12.*+deb12-amd64-unsigned package in the apt sources"
	echo "$pkg"
}

pkg_version() { dpkg-query -W -f='${Version}' "$1"; }

# Download and unpack the kernel package once per package version; prints the
# directory it was unpacked into.
fetch_kernel() {
	local pkg=$1 ver=$2 dir="$OUT/kernel/$1_$2"
	if [[ ! -f $dir/.done ]]; then
		log "downloading $pkg $ver"
		rm -rf "$dir"
		mkdir -p "$dir/deb"
		# apt-get download writes to the current directory; _apt cannot write
		# under /work, which only costs a warning.
		(cd "$dir/deb" && apt-get download -q "$pkg=$ver" >&2 2>/dev/null) ||
			(apt_update_once && cd "$dir/deb" && apt-get download -q "$pkg=$ver" >&2) ||
			die "apt-get download $pkg failed"
		dpkg -x "$dir"/deb/*.deb "$dir/root"
		rm -rf "$dir/deb"
		touch "$dir/.done"
	fi
	echo "$dir/root"
}

# The guest needs these built in; Debian's 6.12 has them all =y. If one ever
# turns into a module we fail loudly rather than boot a guest that cannot
# mount the share.
check_kernel_config() {
	local config=$1 opt val
	for opt in VIRTIO VIRTIO_PCI FUSE_FS VIRTIO_FS SERIAL_8250_CONSOLE \
		DEVTMPFS BLK_DEV_INITRD RD_GZIP; do
		val=$(grep -E "^CONFIG_${opt}=" "$config" | cut -d= -f2 || true)
		[[ $val == y ]] || die "kernel config: CONFIG_$opt=${val:-unset}, need =y ($config)"
	done
}

# cloud-hypervisor boots an uncompressed ELF vmlinux through its PVH entry
# (Debian's kernel has CONFIG_PVH=y); unpack it from the zstd payload of the
# bzImage, as the kernel's scripts/extract-vmlinux does.
extract_vmlinux() {
	local bz=$1 out=$2 off
	for off in $(LC_ALL=C grep -obUaP '\x28\xb5\x2f\xfd' "$bz" | cut -d: -f1); do
		tail -c +$((off + 1)) "$bz" | zstd -dcq 2>/dev/null >"$out" || true
		[[ $(head -c 4 "$out" | od -An -c | tr -d ' ') == 177ELF ]] && return 0
	done
	rm -f "$out"
	die "could not extract an ELF vmlinux from $bz"
}

# pjdfstest from crates.io, built once per version; prints the binary's path,
# or nothing if it cannot be built (no cargo, no registry).
build_pjdfstest() {
	local bin="$PJDFSTEST_DIR/bin/pjdfstest" cargo tmp
	if [[ ! -x $bin ]]; then
		cargo=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
		if [[ ! -x $cargo ]]; then
			log "warning: no cargo: the guest gets no pjdfstest"
			return 0
		fi
		log "building pjdfstest $PJDFSTEST_VERSION from crates.io (once; a few minutes)"
		mkdir -p "$(dirname "$PJDFSTEST_DIR")"
		tmp="$PJDFSTEST_DIR.tmp"
		rm -rf "$tmp"
		if ! "$cargo" install pjdfstest --version "=$PJDFSTEST_VERSION" --locked --root "$tmp" \
			>"$PJDFSTEST_DIR.log" 2>&1; then
			log "warning: cargo install pjdfstest failed (see $PJDFSTEST_DIR.log): the guest gets no pjdfstest"
			rm -rf "$tmp"
			return 0
		fi
		rm -rf "$PJDFSTEST_DIR"
		mv "$tmp" "$PJDFSTEST_DIR"
	fi
	echo "$bin"
}

# Everything that goes into the initramfs, for the stamp.
input_files() {
	printf '%s\n' "$HERE/build-guest.sh" "$HERE"/guest/* "$HERE"/suites/*.sh | sort
}

guest_suites() {
	local f
	for f in "$HERE"/suites/*.sh; do
		case "$f" in *.host.sh | *.hook.sh | *.setup.sh) continue ;; esac
		echo "$f"
	done
}

compute_stamp() {
	local kpkg=$1 kver=$2 pjd=$3
	{
		echo "kernel $kpkg $kver"
		echo "pjdfstest $PJDFSTEST_VERSION ${pjd:+$(sha256sum <"$pjd")}"
		for p in $GUEST_PACKAGES; do echo "$p $(pkg_version "$p")"; done
		input_files | xargs sha256sum
	} | sha256sum | cut -d' ' -f1
}

# Copy a dynamic executable (to DEST inside the root, default its own path)
# and the shared libraries ldd finds for it, each to its own path inside the
# root (which also brings the loader along).
copy_with_libs() {
	local bin=$1 root=$2 dest=${3:-$1} lib
	install -D -m 0755 "$bin" "$root$dest"
	for lib in $(ldd "$bin" | grep -oE '/[^ ]+' | sort -u); do
		install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
	done
}

# git, sqlite3 and GNU tar for the workloads suite, Debian's own binaries (not
# whatever else is first on PATH). git runs its builtins (init, add, commit,
# status) in its one binary; GIT_EXEC_PATH points at an empty git-core
# directory, and an empty template directory keeps `git init` quiet.
add_workload_tools() {
	local root=$1 git sqlite gtar
	git=$(pkg_binary git /usr/bin/git) && sqlite=$(pkg_binary sqlite3 /usr/bin/sqlite3) &&
		gtar=$(pkg_binary tar /bin/tar) || exit 1
	copy_with_libs "$git" "$root" /usr/bin/git
	mkdir -p "$root/usr/lib/git-core" "$root/usr/share/git-core/templates"
	copy_with_libs "$sqlite" "$root" /usr/bin/sqlite3
	# busybox's tar stays `tar`; GNU tar, what a developer's shell runs, is gtar.
	copy_with_libs "$gtar" "$root" /usr/bin/gtar
}

# pkg_binary PACKAGE PATH: PATH as that package installed it (/usr/bin/x or,
# before the /usr merge, /bin/x); dies if the package has no such file.
pkg_binary() {
	local f
	for f in "$2" "/usr$2" "${2#/usr}"; do
		# (grep -q would stop reading early: dpkg's SIGPIPE fails the pipe)
		if dpkg -L "$1" 2>/dev/null | grep -x "$f" >/dev/null && [[ -x $f ]]; then
			echo "$f"
			return 0
		fi
	done
	die "package $1 has no executable $2"
}

# The workloads suite reads its inputs from virtio-blk disks, a module in
# Debian's kernel: copied uncompressed, for busybox's insmod.
add_virtio_blk() {
	local kroot=$1 root=$2 ko
	ko=$(find "$kroot/lib/modules" -name 'virtio_blk.ko*' | head -n 1)
	[[ -n $ko ]] || die "no virtio_blk module under $kroot/lib/modules"
	mkdir -p "$root/lib/modules"
	case "$ko" in
	*.xz) xz -dc "$ko" >"$root/lib/modules/virtio_blk.ko" ;;
	*.zst) zstd -dcq "$ko" >"$root/lib/modules/virtio_blk.ko" ;;
	*) install -m 0644 "$ko" "$root/lib/modules/virtio_blk.ko" ;;
	esac
}

build_initramfs() {
	local tmp=$1 pjd=$2 kroot=$3 root="$1/root" applet suite
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,mnt,tmp,suites,lib,etc}
	install -m 0755 /bin/busybox "$root/bin/busybox"
	for applet in $(/bin/busybox --list); do
		[[ -e $root/bin/$applet ]] || ln -s busybox "$root/bin/$applet"
	done
	copy_with_libs "$(command -v fio)" "$root"
	if [[ -n $pjd ]]; then
		copy_with_libs "$pjd" "$root" /usr/bin/pjdfstest
		install -m 0644 "$HERE/guest/pjdfstest.toml" "$root/etc/pjdfstest.toml"
	fi
	add_workload_tools "$root"
	add_virtio_blk "$kroot" "$root"
	log "compiling fsops"
	gcc -static -O2 -Wall -Wextra -Werror -o "$root/bin/fsops" "$HERE/guest/fsops.c"
	install -m 0755 "$HERE/guest/init" "$root/init"
	install -m 0644 "$HERE/guest/lib.sh" "$root/lib/vmtest.sh"
	install -m 0644 "$HERE/guest/backend-gaps" "$root/lib/backend-gaps"
	while read -r suite; do
		install -m 0755 "$suite" "$root/suites/$(basename "$suite")"
	done < <(guest_suites)
	# nobody (65534, pjdfstest's "-u 65534 -g 65534") and tests: the two
	# unprivileged users pjdfstest switches to (guest/pjdfstest.toml).
	printf '%s\n' "root:x:0:0:root:/:/bin/sh" "tests:x:65533:65533:tests:/:/bin/sh" \
		"nobody:x:65534:65534:nobody:/:/bin/sh" >"$root/etc/passwd"
	printf '%s\n' "root:x:0:" "tests:x:65533:" "nogroup:x:65534:" >"$root/etc/group"
	printf '%s\n' "passwd: files" "group: files" >"$root/etc/nsswitch.conf"
	(cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc -R 0:0 --quiet) |
		gzip -6 >"$tmp/initramfs.cpio.gz"
}

main() {
	parse_args "$@"
	ensure_packages
	local kpkg kver kroot stamp pjd
	kpkg=$(kernel_package)
	kver=$(apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')
	pjd=""
	local built_pjd="$PJDFSTEST_DIR/bin/pjdfstest" full_stamp=""
	if [[ $WITH_PJDFSTEST == 1 ]]; then
		pjd=$(build_pjdfstest)
	elif [[ -x $built_pjd ]]; then
		# A guest built for the suites (with pjdfstest) serves the demo as well.
		full_stamp=$(compute_stamp "$kpkg" "$kver" "$built_pjd")
	fi
	stamp=$(compute_stamp "$kpkg" "$kver" "$pjd")
	if [[ $FORCE == 0 && -f $OUT/stamp && -f $OUT/vmlinuz && -f $OUT/vmlinux &&
		-f $OUT/initramfs.cpio.gz &&
		($(cat "$OUT/stamp") == "$stamp" || (-n $full_stamp && $(cat "$OUT/stamp") == "$full_stamp")) ]]; then
		log "up to date ($kpkg $kver)"
	else
		mkdir -p "$OUT"
		kroot=$(fetch_kernel "$kpkg" "$kver")
		check_kernel_config "$(echo "$kroot"/boot/config-*)"
		TMP=$(mktemp -d "$OUT/.tmp.XXXXXX")
		trap 'rm -rf "$TMP"' EXIT
		build_initramfs "$TMP" "$pjd" "$kroot"
		# Replace the outputs only once everything succeeded.
		install -m 0644 "$(echo "$kroot"/boot/vmlinuz-*)" "$OUT/vmlinuz"
		extract_vmlinux "$OUT/vmlinuz" "$OUT/vmlinux"
		mv "$TMP/initramfs.cpio.gz" "$OUT/initramfs.cpio.gz"
		echo "$stamp" >"$OUT/stamp"
		echo "$kpkg $kver" >"$OUT/kernel-version"
		log "built guest with $kpkg $kver ($(du -h "$OUT/initramfs.cpio.gz" | cut -f1) initramfs)"
	fi
	echo "kernel:    $OUT/vmlinuz"
	echo "vmlinux:   $OUT/vmlinux (ELF, for cloud-hypervisor)"
	echo "initramfs: $OUT/initramfs.cpio.gz"
}

main "$@"
