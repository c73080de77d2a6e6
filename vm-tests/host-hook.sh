#!/usr/bin/env bash
# Host side of the guest<->host handshake used by the coherence checks.
#
# Run by run-vm.sh in the background while the guest runs:
#   host-hook.sh SHARED_DIR
# The guest writes SHARED_DIR/.sync/req-<id> holding one line "ACTION ARGS..."
# (paths relative to SHARED_DIR) and waits for SHARED_DIR/.sync/ack-<id>.
# This hook performs the action on the host right away and writes the ack
# ("ok" or "fail: why"), via a temp file and rename so the guest never reads
# half an answer. Actions:
#   create|modify|append PATH CONTENT   write CONTENT (plus newline) to PATH
#   delete PATH | mkdir PATH | rmdir PATH | rename OLD NEW
#   chmod MODE PATH | truncate PATH SIZE
#   check PATH SHA256        PATH's sha256 must be SHA256
#   content PATH CONTENT     PATH must hold exactly CONTENT plus newline
#   size PATH SIZE           PATH's size must be SIZE
#   absent PATH              PATH must not exist
#   mode PATH MODE           PATH's octal mode must be MODE (e.g. 640)
#   owner PATH UID:GID       PATH's owner and group on the host
#   acl PATH access|default SPEC  PATH's POSIX ACL on the host, in fsops's short
#                            form (u::rw,u:1000:r,g::r,m::r,o::-)
#   directio PATH yes|no     whether the daemon (VMTEST_DAEMON_PID or its child)
#                            holds PATH open with O_DIRECT
# It runs until killed.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

SHARE=${1:?usage: host-hook.sh SHARED_DIR}
SYNC="$SHARE/.sync"

safe_path() {
	case "/$1/" in
	*/../*) echo "fail: path escapes the share: $1"; return 1 ;;
	esac
	printf '%s/%s' "$SHARE" "$1"
}

# do_action ACTION ARGS... : prints the reply
do_action() {
	local action=$1 p q got
	shift
	case "$action" in
	create | modify) p=$(safe_path "$1") && printf '%s\n' "$2" >"$p" && echo ok ;;
	append) p=$(safe_path "$1") && printf '%s\n' "$2" >>"$p" && echo ok ;;
	delete) p=$(safe_path "$1") && rm -f -- "$p" && echo ok ;;
	mkdir) p=$(safe_path "$1") && mkdir -- "$p" && echo ok ;;
	rmdir) p=$(safe_path "$1") && rmdir -- "$p" && echo ok ;;
	rename) p=$(safe_path "$1") && q=$(safe_path "$2") && mv -- "$p" "$q" && echo ok ;;
	chmod) p=$(safe_path "$2") && chmod "$1" -- "$p" && echo ok ;;
	truncate) p=$(safe_path "$1") && truncate -s "$2" -- "$p" && echo ok ;;
	check)
		p=$(safe_path "$1") || return 0
		got=$(sha256sum <"$p" | cut -d' ' -f1) || { echo "fail: cannot read $1"; return 0; }
		[[ $got == "$2" ]] && echo ok || echo "fail: host sha256 of $1 is $got"
		;;
	content)
		p=$(safe_path "$1") || return 0
		got=$(cat -- "$p" 2>&1) || { echo "fail: cannot read $1: $got"; return 0; }
		[[ $got == "$2" ]] && echo ok || echo "fail: host sees '$got' in $1"
		;;
	size)
		p=$(safe_path "$1") || return 0
		got=$(stat -c %s -- "$p" 2>&1) || { echo "fail: $got"; return 0; }
		[[ $got == "$2" ]] && echo ok || echo "fail: host size of $1 is $got"
		;;
	absent)
		p=$(safe_path "$1") || return 0
		[[ ! -e $p && ! -L $p ]] && echo ok || echo "fail: $1 still exists on the host"
		;;
	mode)
		p=$(safe_path "$1") || return 0
		got=$(stat -c %a -- "$p" 2>&1)
		[[ $got == "$2" ]] && echo ok || echo "fail: host mode of $1 is $got"
		;;
	owner)
		p=$(safe_path "$1") || return 0
		got=$(stat -c %u:%g -- "$p" 2>&1)
		[[ $got == "$2" ]] && echo ok || echo "fail: host owner of $1 is $got"
		;;
	acl)
		p=$(safe_path "$1") || return 0
		got=$(host_acl "$p" "$2" 2>&1)
		[[ $got == "$3" ]] && echo ok || echo "fail: host $2 ACL of $1 is '$got'"
		;;
	directio)
		p=$(safe_path "$1") || return 0
		got=$(daemon_open_flags "$p")
		[[ -n $got ]] || { echo "fail: the daemon does not hold $1 open"; return 0; }
		# O_DIRECT is 040000 in fdinfo's octal flags.
		if (((8#$got & 8#40000) != 0)); then got=yes; else got=no; fi
		[[ $got == "$2" ]] && echo ok || echo "fail: the daemon's open of $1 has O_DIRECT: $got"
		;;
	*) echo "fail: unknown action '$action'" ;;
	esac
}

# host_acl PATH access|default: the ACL xattr in fsops's short form.
host_acl() {
	python3 - "$1" "$2" <<'PY'
import os, struct, sys
raw = os.getxattr(sys.argv[1], "system.posix_acl_" + sys.argv[2])
out = []
for off in range(4, len(raw), 8):
    tag, perm, uid = struct.unpack_from("<HHI", raw, off)
    t = {1: "u", 2: "u", 4: "g", 8: "g", 16: "m", 32: "o"}[tag]
    ident = "" if uid == 0xFFFFFFFF else str(uid)
    p = "".join(c for c, b in (("r", 4), ("w", 2), ("x", 1)) if perm & b) or "-"
    out.append(f"{t}:{ident}:{p}")
print(",".join(out))
PY
}

# daemon_open_flags PATH: the octal open flags of the daemon's fd on PATH's inode
# (its first such fd other than an O_PATH one), or nothing.
daemon_open_flags() {
	local want pid fd flags
	want=$(stat -c %d:%i -- "$1") || return 0
	for pid in ${VMTEST_DAEMON_PID:-} $(cat "/proc/${VMTEST_DAEMON_PID:-0}/task/"*/children 2>/dev/null); do
		for fd in /proc/"$pid"/fd/*; do
			[[ $(stat -L -c %d:%i -- "$fd" 2>/dev/null) == "$want" ]] || continue
			flags=$(awk '/^flags:/ {print $2}' "/proc/$pid/fdinfo/${fd##*/}" 2>/dev/null)
			# O_PATH (010000000) fds are the daemon's own node references.
			(((8#${flags:-0} & 8#10000000) == 0)) && { echo "$flags"; return 0; }
		done
	done
}

serve() {
	local req id reply text words
	for req in "$SYNC"/req-*; do
		[[ -f $req ]] || continue
		id=${req##*/req-}
		[[ -e $SYNC/ack-$id ]] && continue
		# The guest removes req-N (then ack-N) once answered; skip if gone.
		text=$(cat -- "$req" 2>/dev/null) || continue
		read -ra words <<<"$text"
		reply=$(do_action "${words[@]}" 2>&1) || true
		[[ -n $reply ]] || reply="fail: no reply"
		printf '%s\n' "$reply" >"$SYNC/.ack-$id.tmp"
		mv -f "$SYNC/.ack-$id.tmp" "$SYNC/ack-$id"
		echo "host-hook: $text -> $reply" >&2
	done
}

while :; do
	serve
	sleep 0.02
done
