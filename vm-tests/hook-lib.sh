# Shared by the suites' host hooks (suites/NAME.hook.sh): follow the guest's
# "VMTEST SYNC <step>" console lines and call `step <step>` once for each.
# Needs SERIAL (the serial log path) and a `step` function in the caller.
#
# Hooks that make checks of their own set HOOK_NAME and RESULTS (a file their
# NAME.host.sh reports) and use pass/fail/info; fail also adds the check to
# FAILS, which a hook's ack turns into its answer to the guest.

log() { echo "$HOOK_NAME: $*"; }
result() { echo "VMTEST $*" >>"$RESULTS"; log "VMTEST $*"; }
pass() { result "PASS $1"; }
fail() { result "FAIL $1: $2"; FAILS="$FAILS $1"; }
info() { result "INFO $*"; }

# ack_in DIR STEP: answers the guest's STEP in DIR/.acks/STEP (the guest waits for
# that file): "ok", or the checks of this step that failed (FAILS). Written under
# a temporary name and renamed, so the guest never reads half an answer.
ack_in() {
	local reply=ok
	[[ -z $FAILS ]] || reply="fail:$FAILS (see $(basename "$RESULTS"))"
	mkdir -p "$1/.acks"
	printf '%s\n' "$reply" >"$1/.acks/.$2.tmp" && mv "$1/.acks/.$2.tmp" "$1/.acks/$2"
}

# The SYNC steps in the serial log so far, complete lines only (the console
# writes a line in pieces; a step must not be read before its newline).
sync_steps() {
	local text
	text=$(tr -d '\r\0' <"$SERIAL" 2>/dev/null; echo .)
	text=${text%.}
	case "$text" in
	*$'\n') ;;
	*$'\n'*) text=${text%$'\n'*}$'\n' ;;
	*) text="" ;;
	esac
	printf '%s' "$text" | grep -a '^VMTEST SYNC ' | cut -d' ' -f3-
}

# Runs `step` for every new SYNC line until the hook is killed.
follow_sync_steps() {
	local seen=0 steps
	while :; do
		mapfile -t steps < <(sync_steps)
		while ((seen < ${#steps[@]})); do
			step "${steps[seen]}"
			seen=$((seen + 1))
		done
		sleep 0.1
	done
}
