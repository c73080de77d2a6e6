#!/usr/bin/env bash
# Host side of the shares suite, run by run-vm.sh after the VM exited:
#   shares.host.sh SHARED_DIR
# b (read-only) and hidden must be exactly as shares.setup.sh left them; a and
# c must hold what the guest did.
set -uo pipefail # no -e: every check runs and reports on its own

S=${1:?usage: shares.host.sh SHARED_DIR}
W=${VMTEST_WORK:?VMTEST_WORK not set (run through run-vm.sh)}
SECRET="VOLFSD-HIDDEN-""SECRET-5f9c2e71"

check() { # check NAME CMD...: CMD prints why on failure
	local name=$1 out
	shift
	if out=$("$@" 2>&1); then
		echo "VMTEST PASS $name"
	else
		echo "VMTEST FAIL $name: $(echo "$out" | tail -n 3 | tr '\n' ' ')"
	fi
}

eq() { [[ $2 == "$3" ]] || { echo "$1: got '$2', want '$3'"; return 1; }; }

b_unchanged() {
	diff <(cd "$S/b" && find . -printf '%y %p %m %s %T@ %l\n' | sort) "$W/b.manifest" || return 1
	(cd "$S/b" && sha256sum --quiet -c "$W/b.sha256") || return 1
}

hidden_unchanged() {
	eq "share root" "$(ls -A "$S" | tr '\n' ' ')" "a b c hidden " &&
		eq "hidden/" "$(ls -A "$S/hidden" | tr '\n' ' ')" "dir secret " &&
		eq "hidden/secret" "$(cat "$S/hidden/secret")" "$SECRET"
}

a_written() {
	local a=$S/a
	eq "renamed.txt" "$(cat "$a/renamed.txt")" "$(printf 'written by the guest\nmore')" &&
		eq "renamed.txt mode" "$(stat -c %a "$a/renamed.txt")" 600 &&
		eq "renamed.txt nlink" "$(stat -c %h "$a/renamed.txt")" 2 &&
		eq "hardlink inode" "$(stat -c %i "$a/hardlink.txt")" "$(stat -c %i "$a/renamed.txt")" &&
		eq "newdir2/deeper/file" "$(cat "$a/newdir2/deeper/file")" deep &&
		eq "trunc.txt" "$(cat "$a/trunc.txt")" trun &&
		eq "guest-link" "$(readlink "$a/guest-link")" renamed.txt || return 1
	for p in new.txt newdir rm-me gone dir; do
		[[ ! -e $a/$p && ! -L $a/$p ]] || { echo "a/$p still exists"; return 1; }
	done
	eq "pattern.bin sha256" "$(sha256sum <"$a/pattern.bin" | cut -d' ' -f1)" "$(cut -d' ' -f1 "$a/pattern.bin.sha256")"
}

guest_read_b() {
	eq "sha256 of b/random.bin read by the guest" "$(cat "$S/a/b-random.sha256")" \
		"$(sha256sum <"$S/b/random.bin" | cut -d' ' -f1)"
}

cross_share_mv() {
	eq "a/f intact" "$(cat "$S/a/f")" "file f in a" &&
		[[ ! -e $S/a/g ]] || { echo "a/g still exists"; return 1; }
	eq "c/g" "$(cat "$S/c/g")" "file g in a, moved to c by the guest" &&
		eq "c/mvdir/x" "$(cat "$S/c/mvdir/x")" in-dir &&
		[[ ! -e $S/a/mvdir && ! -e $S/b/f && ! -e $S/c/f-link && ! -e $S/b/f-link ]] || { echo "leftovers of the mv checks"; return 1; }
}

symlinks_unchanged() {
	eq to-secret "$(readlink "$S/a/to-secret")" ../hidden/secret &&
		eq to-etc "$(readlink "$S/a/to-etc")" /etc/hostname &&
		eq to-root "$(readlink "$S/a/to-root")" / &&
		eq to-abs "$(readlink "$S/a/to-abs")" "$S/hidden/secret"
}

renamed_dir() {
	[[ -d $S/a/d1 && ! -e $S/a/d2 ]] || { echo "a/d1 missing or a/d2 left: $(ls "$S/a")"; return 1; }
	eq "a/d1 listing" "$(ls "$S/a/d1" | tr '\n' ' ')" "f0 f1 f2 f3 f4 f5 f6 f7 inner to-hidden-dir "
}

check host-b-unchanged b_unchanged
check host-hidden-unchanged hidden_unchanged
check host-a-guest-writes a_written
check host-b-read-by-guest guest_read_b
check host-cross-share-mv cross_share_mv
check host-symlinks-unchanged symlinks_unchanged
check host-renamed-dir-back renamed_dir
echo "VMTEST INFO host renamed a/d1 <-> a/d2 $(cat "$S/a/.renames-done" 2>/dev/null || echo '?') times"
