#!/usr/bin/env bash
# The basic VM suite with volfsd and QEMU both run by an unprivileged user:
# volfsd's default `--sandbox namespace` then unshares a user namespace in
# which that user is root, with ids 1.. mapped to the user's /etc/subuid and
# /etc/subgid range (newuidmap/newgidmap, Debian package uidmap).
#
# Run as root (CI does, through run-all.sh). It
#   - installs uidmap and qemu-system-x86 if missing;
#   - creates the user (default volfsd-vmtest, `useradd -m`) if missing, and
#     gives it a 65536-id range in /etc/subuid and /etc/subgid if it has none
#     (starting after every range already there);
#   - builds the guest as root (build-guest.sh), so the user only reads it;
#   - copies the daemon binary, vm-tests/ and build/guest/{vmlinuz,
#     initramfs.cpio.gz} into a temp dir owned by the user (the repo may be
#     somewhere the user cannot read, e.g. under /root; the copy also keeps the
#     binary fixed while the tree is rebuilt);
#   - runs `run-vm.sh --prebuilt-guest --vmm qemu --suite basic --queues 2
#     --smp 2` as the user (setpriv --reuid --regid --init-groups), with the
#     shared dir, logs and work dir owned by it;
#   - checks on the host that the daemon really ran in that mode (checks
#     named unprivileged-*): its serving process (the child of the launched
#     supervisor) runs as the user, in a user namespace whose uid_map/gid_map
#     map 0 to the user and 1.. to its subordinate range, and in its own pid
#     namespace; the files the guest's root created are the user's on the
#     host; the file the guest chowned to 1234:5678 is owned by the subordinate
#     ids START+1233:GSTART+5677.
# The run-vm.sh summary is shown as "run-vm.sh as USER: N passed, N failed";
# the last line is the total with the checks above: "N passed, N failed".
# Exit status: 0 only if run-vm.sh succeeded and every check passed.
#
# Usage: sudo vm-tests/run-unprivileged.sh [options] [run-vm.sh options]
#   --daemon PATH      volfsd binary (default target/release/volfsd)
#   --user NAME        the unprivileged user (default volfsd-vmtest)
#   --log-dir DIR      where the logs are copied at the end (default
#                      build/vm-logs/basic-unprivileged)
#   --keep             keep the temp dir (shared dir, logs)
#   --setup-user-only  only make sure the user and its subordinate ranges exist,
#                      then print "UID GID SUBUID_START SUBUID_COUNT SUBGID_START
#                      SUBGID_COUNT" on the last line (the launcher suite's
#                      session-mode cases run volfsd as this user)
# Other options go to run-vm.sh after the defaults above (so they override
# them), e.g. --daemon-args "--seccomp none" or --timeout 1200.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=runner-lib.sh
. "$HERE/runner-lib.sh"

DAEMON="$REPO/target/release/volfsd"
RUN_USER=volfsd-vmtest
LOG_DIR="$REPO/build/vm-logs/basic-unprivileged"
KEEP=0
SETUP_USER_ONLY=0
SUBID_COUNT=65536
RUN_VM_ARGS=(--vmm qemu --suite basic --queues 2 --smp 2)
EXTRA=()
STAGE=""

say() { echo "run-unprivileged: $*"; }
die() {
	echo "run-unprivileged: error: $*" >&2
	exit 2
}

usage() {
	sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'
	exit "${1:-0}"
}

parse_args() {
	while [[ $# -gt 0 ]]; do
		case "$1" in
		--daemon) DAEMON=${2:?}; shift ;;
		--user) RUN_USER=${2:?}; shift ;;
		--log-dir) LOG_DIR=${2:?}; shift ;;
		--keep) KEEP=1 ;;
		--setup-user-only) SETUP_USER_ONLY=1 ;;
		-h | --help) usage 0 ;;
		# run-vm.sh options that take a value: keep the pair together.
		--vmm | --daemon-args | --suite | --queues | --smp | --mem | --timeout | --host-hook | --cache | --boot-attempts)
			EXTRA+=("$1" "${2?}"); shift ;;
		--shared-dir) die "--shared-dir: this script shares a fresh dir owned by the user" ;;
		*) EXTRA+=("$1") ;;
		esac
		shift
	done
	[[ -x $DAEMON ]] || die "daemon '$DAEMON' is not an executable (cargo build --release, or pass --daemon)"
	DAEMON=$(readlink -f "$DAEMON")
}


ensure_user() {
	if ! id -u "$RUN_USER" >/dev/null 2>&1; then
		say "creating user $RUN_USER"
		useradd -m -s /bin/bash "$RUN_USER" || die "useradd $RUN_USER failed"
	fi
	# With hardware virtualization QEMU may use /dev/kvm (group kvm on Debian).
	if [[ -e /dev/kvm ]] && getent group kvm >/dev/null && ! id -nG "$RUN_USER" | grep -qw kvm; then
		usermod -aG kvm "$RUN_USER" || true
	fi
	RUN_UID=$(id -u "$RUN_USER")
	RUN_GID=$(id -g "$RUN_USER")
	RUN_HOME=$(getent passwd "$RUN_USER" | cut -d: -f6)
}

subid_range() { # subid_range FILE: "START COUNT" of the user's first range, or nothing
	[[ -f $1 ]] || return 0
	awk -F: -v n="$RUN_USER" -v u="$RUN_UID" '($1 == n || $1 == u) && NF == 3 { print $2, $3; exit }' "$1"
}

# A start after every range in both files (at least 100000, like useradd).
free_subid_start() {
	cat /etc/subuid /etc/subgid 2>/dev/null |
		awk -F: 'NF == 3 && $2 + $3 > m { m = $2 + $3 } END { if (m < 100000) m = 100000; printf "%d\n", m }'
}

ensure_subids() {
	local f start
	for f in /etc/subuid /etc/subgid; do
		if [[ -z $(subid_range "$f") ]]; then
			start=$(free_subid_start)
			say "adding $RUN_USER:$start:$SUBID_COUNT to $f"
			[[ -f $f ]] || install -m 0644 /dev/null "$f"
			echo "$RUN_USER:$start:$SUBID_COUNT" >>"$f"
		fi
	done
	read -r SUBUID_START SUBUID_COUNT < <(subid_range /etc/subuid)
	read -r SUBGID_START SUBGID_COUNT < <(subid_range /etc/subgid)
	((SUBUID_COUNT > 5678 && SUBGID_COUNT > 5678)) ||
		die "$RUN_USER's subordinate ranges are too small for the suite's chown 1234:5678 ($SUBUID_COUNT uids, $SUBGID_COUNT gids)"
	say "user $RUN_USER: uid $RUN_UID gid $RUN_GID, subuids $SUBUID_START+$SUBUID_COUNT, subgids $SUBGID_START+$SUBGID_COUNT"
}

# The user's own copy of what run-vm.sh needs, laid out like the repo.
stage() {
	STAGE=$(mktemp -d /tmp/volfs-unpriv.XXXXXX)
	mkdir -p "$STAGE/repo/build/guest" "$STAGE/share" "$STAGE/logs"
	cp -a "$HERE" "$STAGE/repo/vm-tests"
	cp "$REPO/build/guest/vmlinuz" "$REPO/build/guest/initramfs.cpio.gz" "$STAGE/repo/build/guest/"
	cp "$DAEMON" "$STAGE/volfsd"
	chown -R "$RUN_UID:$RUN_GID" "$STAGE"
	chmod 0755 "$STAGE"
}

cleanup() {
	[[ -n $STAGE ]] || return 0
	if [[ $KEEP == 1 ]]; then
		say "kept $STAGE"
	else
		rm -rf "$STAGE"
	fi
}

PASSED=0
FAILED=0
check() { # check NAME WANT GOT WHAT
	if [[ $3 == "$2" ]]; then pass "$1"; else fail "$1" "$4: got '$3', want '$2'"; fi
}

# Host-side proof of the mode, from run-vm.sh's daemon-ids.txt (taken while the
# guest ran) and from what the guest left in the share.
mode_checks() {
	local ids="$STAGE/logs/daemon-ids.txt" B="$STAGE/share/basic" launched serving
	say "host-side checks of the unprivileged mode"
	if [[ ! -s $ids ]]; then
		fail unprivileged-daemon-ids "run-vm.sh recorded no daemon ids (the guest never reached /init?)"
		return
	fi
	sed 's/^/  | /' "$ids"
	launched=$(awk '$1 == "launched" {print $2}' "$ids")
	serving=$(awk '$1 == "serving" {print $2}' "$ids")
	if [[ -n $serving && $serving != "$launched" ]]; then
		pass unprivileged-supervisor-and-child
	else
		fail unprivileged-supervisor-and-child "launched pid $launched has no single serving child ($serving)"
	fi
	check unprivileged-daemon-runs-as-user "$RUN_UID $RUN_UID $RUN_UID $RUN_UID" \
		"$(awk '$1 == "Uid:" {print $2, $3, $4, $5}' "$ids")" "host uids (real, effective, saved, fs) of the serving process"
	check unprivileged-daemon-group "$RUN_GID $RUN_GID $RUN_GID $RUN_GID" \
		"$(awk '$1 == "Gid:" {print $2, $3, $4, $5}' "$ids")" "host gids of the serving process"
	check unprivileged-uid-map "0 $RUN_UID 1,1 $SUBUID_START $SUBUID_COUNT" \
		"$(awk '$1 == "uid_map" {print $2, $3, $4}' "$ids" | paste -sd,)" "uid_map of the serving process"
	check unprivileged-gid-map "0 $RUN_GID 1,1 $SUBGID_START $SUBGID_COUNT" \
		"$(awk '$1 == "gid_map" {print $2, $3, $4}' "$ids" | paste -sd,)" "gid_map of the serving process"
	check unprivileged-pid-namespace 1 "$(awk '$1 == "NSpid:" && NF == 3 {print $3}' "$ids")" \
		"pid of the serving process in its own pid namespace (NSpid)"
	# The guest's root is the user on the host; its chown 1234:5678 lands on
	# the subordinate ids.
	check unprivileged-guest-root-files-owned-by-user "$RUN_UID:$RUN_GID $RUN_UID:$RUN_GID" \
		"$(stat -c %u:%g "$B" "$B/f.final" 2>&1 | paste -sd' ')" "host owner of basic/ and basic/f.final (created by the guest's root)"
	check unprivileged-guest-chown-subordinate-ids "$((SUBUID_START + 1233)):$((SUBGID_START + 5677))" \
		"$(stat -c %u:%g "$B/a" 2>&1)" "host owner of basic/a (chowned to 1234:5678 in the guest)"
}

main() {
	parse_args "$@"
	[[ $EUID == 0 ]] || die "run as root (it creates the user and installs packages; the suite itself runs as $RUN_USER)"
	trap cleanup EXIT
	trap 'exit 130' INT TERM
	ensure_packages uidmap qemu-system-x86
	ensure_user
	ensure_subids
	if [[ $SETUP_USER_ONLY == 1 ]]; then
		echo "$RUN_UID $RUN_GID $SUBUID_START $SUBUID_COUNT $SUBGID_START $SUBGID_COUNT"
		exit 0
	fi
	"$HERE/build-guest.sh" --quiet >/dev/null || die "build-guest.sh failed"
	stage
	say "running run-vm.sh as $RUN_USER in $STAGE"
	local t0=$SECONDS rc=0
	(cd "$STAGE" && setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --init-groups -- \
		env HOME="$RUN_HOME" USER="$RUN_USER" LOGNAME="$RUN_USER" \
		"$STAGE/repo/vm-tests/run-vm.sh" --prebuilt-guest --daemon "$STAGE/volfsd" \
		--shared-dir "$STAGE/share" --log-dir "$STAGE/logs" \
		"${RUN_VM_ARGS[@]}" "${EXTRA[@]}") 2>&1 |
		sed -u "s/^\([0-9]\+ passed, [0-9]\+ failed\)$/run-vm.sh as $RUN_USER: \1/" |
		tee "$STAGE/run-vm.out" || rc=$?
	local counts p=0 f=0
	counts=$(grep -oE '[0-9]+ passed, [0-9]+ failed$' "$STAGE/run-vm.out" | tail -n 1 || true)
	if [[ -n $counts ]]; then
		p=${counts%% passed*}
		f=${counts#*, }
		f=${f%% failed*}
	fi
	mode_checks
	mkdir -p "$LOG_DIR"
	rm -f "$LOG_DIR"/*.log "$LOG_DIR"/*.txt "$LOG_DIR"/run-vm.out
	cp -a "$STAGE/logs/." "$STAGE/run-vm.out" "$LOG_DIR/" 2>/dev/null || true
	say "run-vm.sh exit status $rc; logs in $LOG_DIR; took $((SECONDS - t0))s"
	# A run-vm.sh failure without a counted failure (e.g. a setup error) is one.
	[[ $rc == 0 || $f != 0 ]] || f=1
	echo "$((p + PASSED)) passed, $((f + FAILED)) failed"
	[[ $rc == 0 && $FAILED == 0 ]]
}

main "$@"
