#!/usr/bin/env bash
# End-to-end test of the reference JuiceFS volume plugin
# (plugins/juicefs/volfsd-juicefs-plugin) with volfsd, playing the platform:
#   1. the controller's create: a new volume (exit 0, JSON, private_data)
#   2. the plugin's own refusals: a bad volume id, a missing flag, a hostPath
#      that a symlink sends outside volumeBaseDir (non-zero exit, an error)
#   3. a sandbox VM (QEMU, volfsd with its defaults and a control socket) whose
#      node agent (suites/plugin.hook.sh) rolls back a failed create, attaches
#      the volume (refCount 0) and binds it into the share with
#      `volfsd ctl attach --bind`, lets the guest read and write it, attaches
#      and detaches a second sandbox (refCount 1), then detaches in reverse
#      order: volfsd first, then the plugin, which unmounts JuiceFS
#   4. the data outlives the detach (attached again on a fresh mount), and the
#      controller's destroy removes it
# JuiceFS runs on Redis (unix socket) with local object storage, as in
# run-backend.sh. Needs root. Ends with "N passed, N failed".
# Usage: vm-tests/run-plugin.sh [--keep-work] [run-vm.sh args...]
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PLUGIN=$REPO/plugins/juicefs/volfsd-juicefs-plugin
KEEP_WORK=0
if [[ ${1:-} == --keep-work ]]; then KEEP_WORK=1; shift; fi

log() { echo "run-plugin: $*" >&2; }
die() { log "error: $*"; exit 2; }
[[ $EUID == 0 ]] || die "needs root (FUSE mounts, bind mounts)"

WORK=$(mktemp -d /var/tmp/volfsd-plugin.XXXXXX)
PASSED=0 FAILED=0
pass() { echo "  VMTEST PASS $1"; PASSED=$((PASSED + 1)); }
fail() { echo "  VMTEST FAIL $1: $2"; FAILED=$((FAILED + 1)); }

cleanup() {
	local m
	# Anything the plugin left mounted under the base dir (only on failure).
	for m in $(awk -v d="$WORK/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
	done
	juicefs_stop
	if [[ $KEEP_WORK == 1 ]]; then log "work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# shellcheck source=backend-lib.sh
. "$HERE/backend-lib.sh"
juicefs_volume
export JUICEFS_META_URL=$JUICEFS_META JUICEFS_PLUGIN_LOG=$WORK/plugin-juicefs.log
BASE=$WORK/volume-base
VOLID=vol-e2e

json() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2], ""); print(v if isinstance(v, str) else json.dumps(v))' "$1" "$2"; }

# expect_refusal NAME WHAT ARGS...: the plugin must exit non-zero with a
# non-empty error whose text contains WHAT
expect_refusal() {
	local name=$1 what=$2 out rc=0 err
	shift 2
	out=$("$PLUGIN" "$@" 2>/dev/null) || rc=$?
	err=$(json "$out" error 2>/dev/null) || { fail "$name" "stdout is not JSON: $out"; return; }
	if [[ $rc != 0 && $err == *"$what"* ]]; then
		pass "$name"
	else
		fail "$name" "status $rc, error '$err' (want non-zero and an error about '$what')"
	fi
}

echo "plugin: create and refusals"
out=$("$PLUGIN" --op create --volume-id "$VOLID" --name "$VOLID") && rc=0 || rc=$?
PRIVATE=$(json "$out" private_data)
if [[ $rc == 0 && -z $(json "$out" error) && $PRIVATE == "volumes/$VOLID" && $(json "$out" token) == "" ]]; then
	pass plugin-create
else
	fail plugin-create "status $rc: $out"
fi
expect_refusal plugin-refuses-bad-volume-id "not a plain name" --op create --volume-id ../etc --name x
expect_refusal plugin-attach-needs-ref-count "--ref-count" --op attach --volume-id "$VOLID" \
	--sandbox-id sb --namespace default --volume-base-dir "$BASE"
mkdir -p "$BASE" "$WORK/outside"
ln -s "$WORK/outside" "$BASE/juicefs-evil"
expect_refusal plugin-refuses-hostpath-outside-base "outside volume base dir" --op attach --volume-id evil \
	--sandbox-id sb --namespace default --ref-count 0 --volume-base-dir "$BASE"
[[ $(awk -v d="$WORK/outside" '$5 == d' /proc/self/mountinfo) == "" ]] && pass plugin-mounted-nothing-outside ||
	fail plugin-mounted-nothing-outside "something is mounted on $WORK/outside"
rm "$BASE/juicefs-evil"
expect_refusal plugin-refcount-1-needs-a-mount "not a JuiceFS mount" --op attach --volume-id "$VOLID" \
	--sandbox-id sb --namespace default --ref-count 1 --volume-base-dir "$BASE" --private-data "$PRIVATE"
expect_refusal plugin-detach-needs-its-metadata "no mount_dir" --op detach --volume-id "$VOLID" \
	--sandbox-id sb --namespace default --ref-count 0 --metadata '{"mount_dir":"/etc"}'

echo "plugin: a sandbox VM with the volume attached at runtime"
vm_rc=0
PLUGIN_BIN=$PLUGIN PLUGIN_BASE_DIR=$BASE PLUGIN_VOLUME_ID=$VOLID PLUGIN_PRIVATE_DATA=$PRIVATE \
	"$HERE/run-vm.sh" --vmm qemu --suite plugin --host-hook none "$@" | tee "$WORK/vm.out" || vm_rc=$?
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$WORK/vm.out" | tail -n 1 || true)
if [[ -n $line ]]; then
	PASSED=$((PASSED + ${line%% passed*}))
	f=${line#*passed, }
	FAILED=$((FAILED + ${f%% failed}))
else
	fail plugin-vm "run-vm.sh gave no result line (status $vm_rc)"
fi

echo "plugin: the data after the detach, and destroy"
out=$("$PLUGIN" --op attach --sandbox-id sb-9 --namespace default --volume-id "$VOLID" --ref-count 0 \
	--volume-base-dir "$BASE" --private-data "$PRIVATE") || true
hp=$(json "$out" host_path) md=$(json "$out" metadata)
if [[ -n $hp && -f $hp/guest.bin ]] && [[ $(sha256sum <"$hp/guest.bin" | cut -d' ' -f1) == "$(cut -d' ' -f1 <"$hp/guest.bin.sha256")" ]] &&
	[[ $(cat "$hp/after-second.txt") == after-second ]]; then
	pass plugin-data-kept-after-detach
else
	fail plugin-data-kept-after-detach "attach: $out; files: $(ls -A "$hp" 2>&1 | tr '\n' ' ')"
fi
out=$("$PLUGIN" --op detach --sandbox-id sb-9 --namespace default --volume-id "$VOLID" --ref-count 0 --metadata "$md") &&
	[[ -z $(json "$out" error) && ! -e $hp ]] && pass plugin-detach-again || fail plugin-detach-again "$out"
out=$("$PLUGIN" --op destroy --volume-id "$VOLID") && [[ $(json "$out" error) == "" ]] && pass plugin-destroy ||
	fail plugin-destroy "$out"
# A scratch mount of the whole file system: the volume's directory is gone.
mkdir -p "$WORK/check"
juicefs_mount "$WORK/check" "$WORK/juicefs-check.log"
if [[ -d $WORK/check/volumes && ! -e $WORK/check/volumes/$VOLID ]]; then
	pass plugin-destroy-removed-the-data
else
	fail plugin-destroy-removed-the-data "$(ls -A "$WORK/check/volumes" 2>&1 | tr '\n' ' ')"
fi
juicefs_umount "$WORK/check"

echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
