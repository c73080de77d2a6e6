#!/usr/bin/env bash
# Host hook of the plugin suite: plays a node agent (CubeSandbox's Cubelet) that
# uses the reference JuiceFS volume plugin (plugins/juicefs) through the binary
# hook protocol, and volfsd's control socket, as the guest asks:
#   plugin.hook.sh SHARED_DIR SERIAL_LOG
# Steps (guest console "VMTEST SYNC STEP"):
#   attach   first a sandbox create that fails after the plugin's attach and is
#            rolled back (detach with refCount 0: nothing left mounted); then
#            sandbox sb-1: attach (refCount 0, the plugin mounts), the hostPath
#            checked (symlinks resolved, inside volumeBaseDir), and
#            `volfsd ctl attach vol --bind HOSTPATH`
#   second   sandbox sb-2 on the same node: attach with refCount 1 returns the
#            same hostPath without a second mount; detach with refCount 1
#            leaves it mounted
#   detach   sb-1 goes: `volfsd ctl detach vol`, then the plugin's detach with
#            refCount 0, which must be able to unmount JuiceFS (volfsd let go)
# Acks: VOL/.acks/STEP ("ok" or "fail: ...") while the volume is attached; the
# detach's in a local volume detach-done attached for the purpose.
# Results: $VMTEST_LOG_DIR/plugin-hook-results.log (plugin.host.sh reports them).
set -uo pipefail

S=${1:?usage: plugin.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: plugin.hook.sh SHARED_DIR SERIAL_LOG}
W=${VMTEST_WORK:?}
VOLFSD=${VMTEST_DAEMON:?}
SOCK=$W/ctl.sock
BASE=${PLUGIN_BASE_DIR:?}
VOLID=${PLUGIN_VOLUME_ID:?}
PRIVATE=${PLUGIN_PRIVATE_DATA:?}
RESULTS=$VMTEST_LOG_DIR/plugin-hook-results.log
: >"$RESULTS"

HOOK_NAME=plugin-hook
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"
ctl() { "$VOLFSD" ctl "$@" --control-socket "$SOCK"; }

# json JSON KEY: a string field ("" if absent)
json() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2], ""); print(v if isinstance(v, str) else json.dumps(v))' "$1" "$2"; }

juicefs_mounts_at() { awk -v p="$1" '$5 == p {n++} END {print n + 0}' /proc/self/mountinfo; }

# The agent's check of a hostPath, stricter than the platform's lexical one:
# it must exist, and its real path (symlinks resolved) must be inside the real
# volumeBaseDir. Prints the real path.
checked_host_path() {
	local real base
	real=$(realpath -e -- "$1" 2>/dev/null) || { echo "hostPath $1 does not exist" >&2; return 1; }
	base=$(realpath -e -- "$BASE") || return 1
	[[ $real == "$base"/* ]] || { echo "hostPath $1 resolves to $real, outside $base" >&2; return 1; }
	echo "$real"
}

ack() { ack_in "$1" "$2"; } # ack DIR STEP

# hook_attach SANDBOX REFCOUNT CHECK: run the plugin's attach and check its
# answer; sets HOST_PATH and METADATA (empty on failure)
hook_attach() {
	local out err
	HOST_PATH="" METADATA=""
	out=$("$PLUGIN_BIN" --op attach --sandbox-id "$1" --namespace default --volume-id "$VOLID" \
		--ref-count "$2" --volume-base-dir "$BASE" --private-data "$PRIVATE" 2>>"$VMTEST_LOG_DIR/plugin-stderr.log")
	local rc=$?
	info "plugin attach $1 refCount $2 -> status $rc: $out"
	err=$(json "$out" error 2>/dev/null) || err="stdout is not JSON: $out"
	if [[ $rc != 0 || -n $err ]]; then
		fail "$3" "plugin attach $1: status $rc, error '$err'"
		return 1
	fi
	HOST_PATH=$(json "$out" host_path) METADATA=$(json "$out" metadata)
	pass "$3"
}

# hook_detach SANDBOX REFCOUNT CHECK: the plugin's detach with Attach's metadata
hook_detach() {
	local out err rc
	out=$("$PLUGIN_BIN" --op detach --sandbox-id "$1" --namespace default --volume-id "$VOLID" \
		--ref-count "$2" --metadata "$METADATA" 2>>"$VMTEST_LOG_DIR/plugin-stderr.log")
	rc=$?
	info "plugin detach $1 refCount $2 -> status $rc: $out"
	err=$(json "$out" error 2>/dev/null) || err="stdout is not JSON: $out"
	if [[ $rc != 0 || -n $err ]]; then
		fail "$3" "plugin detach $1: status $rc, error '$err'"
		return 1
	fi
	pass "$3"
}

# A sandbox create that fails after the plugin mounted: volfsd refuses the
# attach (a name its rule rejects: the dot), and the agent rolls back with the
# plugin's detach (refCount 0, as no sandbox holds the volume). Nothing may be
# left: no JuiceFS mount, no mount point, no bind mount in the share, no volume.
rollback() {
	local out list
	hook_attach sb-0 0 host-plugin-attach-before-failed-create || return
	if out=$(ctl attach bad.name --bind "$HOST_PATH" 2>&1); then
		fail host-create-fails-after-attach "volfsd accepted the volume name 'bad.name'"
		ctl detach bad.name >/dev/null 2>&1
	else
		pass host-create-fails-after-attach
		info "volfsd ctl attach bad.name: $out"
	fi
	hook_detach sb-0 0 host-plugin-rollback-detach || return
	list=$(ctl list 2>&1)
	if [[ $(juicefs_mounts_at "$HOST_PATH") == 0 && ! -e $HOST_PATH && ! -e $S/bad.name && $list == "no volumes attached" ]]; then
		pass host-rollback-leaves-nothing
	else
		fail host-rollback-leaves-nothing "after the rollback: mounts at $HOST_PATH: $(juicefs_mounts_at "$HOST_PATH"), exists: $([[ -e $HOST_PATH ]] && echo yes || echo no), $S/bad.name exists: $([[ -e $S/bad.name ]] && echo yes || echo no), ctl list: $(tr '\n' '|' <<<"$list")"
	fi
}

step() {
	local out real first
	FAILS=""
	log "step: $1"
	case "$1" in
	attach)
		rollback
		hook_attach sb-1 0 host-plugin-attach-sb-1 || return
		if real=$(checked_host_path "$HOST_PATH" 2>&1); then
			pass host-hostpath-inside-base
		else
			fail host-hostpath-inside-base "$real"
			return
		fi
		[[ $(awk -v p="$real" '$5 == p {print $(NF - 2)}' /proc/self/mountinfo) == fuse.juicefs ]] &&
			pass host-hostpath-is-juicefs ||
			fail host-hostpath-is-juicefs "$real is not a JuiceFS mount: $(findmnt -n "$real" 2>&1)"
		# A guest without uid translation is root on the volume: its setuid files
		# and device nodes must mean nothing on the node (docs/SECURITY.md).
		local opts
		opts=$(awk -v p="$real" '$5 == p {print $6}' /proc/self/mountinfo)
		[[ ,$opts, == *,nosuid,* && ,$opts, == *,nodev,* ]] &&
			pass host-hostpath-is-nosuid-nodev ||
			fail host-hostpath-is-nosuid-nodev "$real is mounted $opts"
		printf 'written on the node before the attach\n' >"$real/from-node.txt"
		if out=$(ctl attach vol --bind "$real" 2>&1); then
			pass host-ctl-attach-vol
			info "ctl attach vol: $out"
		else
			fail host-ctl-attach-vol "$out"
			return
		fi
		FIRST_PATH=$real FIRST_METADATA=$METADATA
		ack "$real" attach
		;;
	second)
		first=$FIRST_PATH
		hook_attach sb-2 1 host-plugin-attach-sb-2-refcount-1
		[[ $HOST_PATH == "$first" ]] && pass host-second-sandbox-same-hostpath ||
			fail host-second-sandbox-same-hostpath "sb-2 got '$HOST_PATH', sb-1 '$first'"
		[[ $(juicefs_mounts_at "$first") == 1 ]] && pass host-no-second-mount ||
			fail host-no-second-mount "$(juicefs_mounts_at "$first") mounts at $first"
		hook_detach sb-2 1 host-plugin-detach-sb-2-refcount-1
		mountpoint -q "$first" && pass host-refcount-1-detach-keeps-mount ||
			fail host-refcount-1-detach-keeps-mount "$first is no longer mounted"
		METADATA=$FIRST_METADATA
		ack "$first" second
		;;
	detach)
		if out=$(ctl detach vol 2>&1); then pass host-ctl-detach-vol; else fail host-ctl-detach-vol "$out"; fi
		METADATA=$FIRST_METADATA
		hook_detach sb-1 0 host-plugin-detach-unmounts
		if [[ $(juicefs_mounts_at "$FIRST_PATH") == 0 && ! -e $FIRST_PATH ]]; then
			pass host-juicefs-unmounted-after-detach
		else
			fail host-juicefs-unmounted-after-detach "$FIRST_PATH: $(juicefs_mounts_at "$FIRST_PATH") mounts, exists: $([[ -e $FIRST_PATH ]] && echo yes || echo no)"
		fi
		# The volume is gone, so the answer comes through a small local volume.
		mkdir -p "$W/detach-done"
		ctl attach detach-done --bind "$W/detach-done" >/dev/null 2>&1
		ack "$W/detach-done" detach
		;;
	*) log "unknown step: $1" ;;
	esac
}

follow_sync_steps
