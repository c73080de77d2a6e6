#!/usr/bin/env bash
# Host hook of sandbox B in the two-sandbox suite (pair-b.sh), run by run-vm.sh
# alongside B's guest: pair-b.hook.sh SHARED_DIR SERIAL_LOG
# B's volume is read-only, so B cannot write its own markers: on
# "VMTEST SYNC mark NAME" this writes vol/.pair/NAME on the host (under a
# temporary name, then renamed, so A never sees half a marker).
set -uo pipefail

S=${1:?usage: pair-b.hook.sh SHARED_DIR SERIAL_LOG}
SERIAL=${2:?usage: pair-b.hook.sh SHARED_DIR SERIAL_LOG}
# shellcheck source=../hook-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../hook-lib.sh"

step() {
	local name
	case "$1" in
	"mark "*)
		name=${1#mark }
		[[ $name =~ ^b-[a-z0-9-]+$ ]] || { echo "pair-b-hook: bad marker name '$name'"; return; }
		printf 'b\n' >"$S/vol/.pair/.$name.tmp" && mv "$S/vol/.pair/.$name.tmp" "$S/vol/.pair/$name"
		;;
	*) echo "pair-b-hook: unknown step: $1" ;;
	esac
}

follow_sync_steps
