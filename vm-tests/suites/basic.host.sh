#!/usr/bin/env bash
# Host side of the basic suite: run by run-vm.sh after the VM exited, given
# the shared dir. Checks on the host what the guest left in SHARE/basic.
# Prints "VMTEST PASS name" / "VMTEST FAIL name: why" like the guest does.
set -uo pipefail # no -e: every check runs and reports on its own

SHARE=${1:?usage: basic.host.sh SHARED_DIR}
B="$SHARE/basic"
NFILES=${NFILES:-10000}
BIG_MIB=${BIG_MIB:-256} # as basic.sh: run-vm.sh gives the guest the same value
# shellcheck source=../backend-gaps.sh
. "$(dirname "${BASH_SOURCE[0]}")/../backend-gaps.sh"

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

# host_id uid|gid ID: the host id of the daemon's id ID, through the uid_map /
# gid_map run-vm.sh recorded ($VMTEST_DAEMON_IDS). The same id without a map
# (or with the initial namespace's "0 0 4294967295"); in volfsd's unprivileged
# mode (a user namespace) guest uid 1234 is the host's subordinate id START+1233.
host_id() {
	local kind=$1 id=$2 f=${VMTEST_DAEMON_IDS:-}
	if [[ -z $f || ! -f $f ]] || ! grep -q "^${kind}_map " "$f"; then
		echo "$id"
		return
	fi
	awk -v k="${kind}_map" -v id="$id" '$1 == k && id >= $2 && id < $2 + $4 { printf "%d\n", $3 + id - $2; found = 1; exit }
		END { if (!found) print "unmapped(" id ")" }' "$f"
}

# The guest wrote FILE.sha256 next to FILE; the host's hash must match.
sha_matches() {
	local f=$1 want got
	[[ -f $f && -f $f.sha256 ]] || { echo "$f or $f.sha256 missing"; return 1; }
	want=$(cut -d' ' -f1 <"$f.sha256")
	got=$(sha256sum <"$f" | cut -d' ' -f1)
	eq "sha256 of ${f#"$SHARE"/}" "$got" "$want"
}

big_file() {
	local f size
	f=$(ls "$B"/big.bin 2>/dev/null) || { echo "big.bin missing"; return 1; }
	size=$(stat -c %s "$f")
	((size >= BIG_MIB * 1048576)) || { echo "big.bin is only $size bytes (want $BIG_MIB MiB)"; return 1; }
	sha_matches "$f"
}

parallel_files() {
	sha_matches "$B/par0.bin" && sha_matches "$B/par1.bin" &&
		[[ $(stat -c %s "$B/par0.bin") == "$(stat -c %s "$B/par1.bin")" ]]
}

many_files() {
	local got
	got=$(find "$B/many" -mindepth 1 -maxdepth 1 | wc -l)
	eq "entries in many/" "$got" "$NFILES" || return 1
	diff <(find "$B/many" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort) <(seq 0 $((NFILES - 1)) | sed 's/^/f/' | sort) |
		head -n 5 | grep . && return 1
	eq "content of many/f7" "$(cat "$B/many/f7")" f7
}

attributes() {
	eq "mode of a" "$(stat -c %a "$B/a")" 751 &&
		eq "owner of a" "$(stat -c %u:%g "$B/a")" "$(host_id uid 1234):$(host_id gid 5678)" || return 1
	backend_lacks set-mtime && return 0 # the guest checked the backend's answer
	eq "mtime of t" "$(stat -c %.9Y "$B/t" 2>/dev/null || stat -c %y "$B/t")" 1500000000.987654321 &&
		eq "atime of t" "$(stat -c %.9X "$B/t" 2>/dev/null || stat -c %x "$B/t")" 1000000000.123456789
}

links() {
	if ! backend_lacks hard-links; then
		eq "nlink of l1" "$(stat -c %h "$B/l1")" 2 &&
			eq "l1/l2 same inode" "$(stat -c %i "$B/l1")" "$(stat -c %i "$B/l2")" || return 1
	fi
	eq "symlink s1" "$(readlink "$B/s1")" l1 &&
		eq "symlink dangling" "$(readlink "$B/dangling")" /nonexistent/target
}

renames() {
	eq "rb" "$(cat "$B/rb")" OVER && [[ ! -e $B/ra && ! -e $B/rc ]] &&
		eq "rdir2/x" "$(cat "$B/rdir2/x")" in || return 1
	if backend_lacks rename-flags; then
		eq "n1" "$(cat "$B/n1")" one && eq "n2" "$(cat "$B/n2")" two
		return
	fi
	[[ -d $B/n2 ]] && eq "xd" "$(cat "$B/xd")" one && eq "n3" "$(cat "$B/n3")" two
}

files_and_dirs() {
	eq "f.final" "$(cat "$B/f.final")" keep && eq "f size" "$(stat -c %s "$B/f")" 0 || return 1
	[[ -d $B/keepdir ]] || { echo "keepdir missing"; return 1; }
	[[ ! -e $B/d1 ]] || { echo "d1 left behind after rmdir"; return 1; }
}

sparse() {
	local blocks
	if backend_lacks holes; then
		eq "sparse size" "$(stat -c %s "$B/sparse")" 67108864 &&
			eq "data at 32M" "$(dd if="$B/sparse" bs=1 skip=33554432 count=4 2>/dev/null)" DATA || return 1
		backend_lacks fallocate && return 0 # the guest checked every mode's EOPNOTSUPP
		eq "falloc size" "$(stat -c %s "$B/falloc")" 1048576 &&
			eq "punched size" "$(stat -c %s "$B/punched")" 4194304 || return 1
		cmp -s <(dd if="$B/punched" bs=1M skip=1 count=1 2>/dev/null) <(head -c 1048576 /dev/zero) ||
			{ echo "punched range is not zeros on the host"; return 1; }
		sha_matches "$B/punched"
		return
	fi
	eq "sparse size" "$(stat -c %s "$B/sparse")" 67108864 || return 1
	blocks=$(stat -c %b "$B/sparse")
	((blocks * 512 < 1048576)) || { echo "sparse file has $((blocks * 512)) bytes allocated on the host"; return 1; }
	eq "data at 32M" "$(dd if="$B/sparse" bs=1 skip=33554432 count=4 2>/dev/null)" DATA || return 1
	eq "falloc size" "$(stat -c %s "$B/falloc")" 1048576 || return 1
	(($(stat -c %b "$B/falloc") * 512 >= 2097152)) || { echo "falloc keep-size allocation not on the host"; return 1; }
	eq "punched size" "$(stat -c %s "$B/punched")" 4194304 || return 1
	cmp -s <(dd if="$B/punched" bs=1M skip=1 count=1 2>/dev/null) <(head -c 1048576 /dev/zero) ||
		{ echo "punched range is not zeros on the host"; return 1; }
	sha_matches "$B/punched"
}

statfs_matches() {
	local guest host_blocks
	guest=$(cat "$B/statfs.txt") || return 1
	host_blocks=$(stat -f -c %b "$SHARE")
	[[ $guest == *" blocks=$host_blocks "* ]] || { echo "guest statfs '$guest' vs host blocks=$host_blocks"; return 1; }
}

fsync_file() { eq "synced" "$(cat "$B/synced")" "$(printf 'fsync-line\nfsync-line')"; }

check host-files-and-dirs files_and_dirs
check host-renames renames
check host-links links
check host-attributes attributes
check host-fsync fsync_file
check host-sparse-fallocate sparse
check host-odirect sha_matches "$B/direct.bin"
check host-copy-file-range sha_matches "$B/cfr-dst.bin"
check host-statfs statfs_matches
check host-parallel-checksums parallel_files
check host-many-files many_files
check host-bigfile-sha256 big_file
check host-no-sync-leftovers bash -c "[[ -z \$(ls -A '$SHARE/.sync' 2>/dev/null) ]] || { echo 'unanswered requests: '; ls -A '$SHARE/.sync'; exit 1; }"
