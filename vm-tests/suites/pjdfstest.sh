# Guest side of the pjdfstest suite: the setuid/setgid rules of pjdfstest's
# chmod/12.t over the share, with the daemon's default flags.
#
# The original C pjdfstest's chmod/12.t has no counterpart in the Rust
# rewrite (crate pjdfstest 0.2.2, in the guest as /usr/bin/pjdfstest), so:
#   chmod-12-suid, chmod-12-sgid  the exact chmod/12.t sequence, written here
#       with fsops (create 0644, chmod 04777 / 02777, mode must read so, then
#       as uid/gid 65534 open O_WRONLY and write "x": the mode must read 0777,
#       the setuid / setgid bit cleared, as Linux does; then unlink)
#   killpriv-truncate, killpriv-chown  the same rule for truncate by a
#       non-owner and for chown (not in chmod/12.t; extra)
#   pjdfstest:NAME  every test of the Rust pjdfstest's chmod group (the
#       related ones: change_perm, update_ctime, clear_isgid_bit, errnos),
#       one result per test case; "skipped" cases are INFO lines.
. /lib/vmtest.sh

D=$M/pjdfstest
mkdir -p "$D"
chmod 0755 "$D"

# mode_is WHAT PATH WANT
mode_is() { eq "$1" "$(fsops mode "$2")" "$3"; }

# chmod/12.t, one half: BITS is 04777 or 02777
t_chmod12() {
	_f=$D/chmod12-$1
	rm -f "$_f"
	fsops open "$_f" cx # create, mode 0644 (umask 022)
	mode_is "mode after create" "$_f" 0644
	fsops chmod "$1" "$_f"
	mode_is "mode after chmod $1" "$_f" "$1"
	fsops asuser 65534 65534 fsops write "$_f" x
	mode_is "mode after a write by uid 65534" "$_f" 0777
	rm "$_f"
}

# truncate(2) by a non-owner must clear the setuid bit too
t_killpriv_truncate() {
	_f=$D/killpriv-truncate
	rm -f "$_f"
	echo data >"$_f"
	fsops chmod 04777 "$_f"
	mode_is "mode after chmod 04777" "$_f" 04777
	fsops asuser 65534 65534 fsops truncate "$_f" 1
	mode_is "mode after truncate by uid 65534" "$_f" 0777
	rm "$_f"
}

# chown of a setuid/setgid executable clears both bits (Linux: also for root)
t_killpriv_chown() {
	_f=$D/killpriv-chown
	rm -f "$_f"
	echo data >"$_f"
	fsops chmod 06777 "$_f"
	mode_is "mode after chmod 06777" "$_f" 06777
	chown 65534:65534 "$_f"
	mode_is "mode after chown 65534:65534" "$_f" 0777
	rm "$_f"
}

run chmod-12-suid t_chmod12 04777
run chmod-12-sgid t_chmod12 02777
run killpriv-truncate t_killpriv_truncate
run killpriv-chown t_killpriv_chown

# The Rust pjdfstest: one VMTEST line per test case of the chmod group.
pjdfstest_group() {
	_out=/tmp/pjdfstest-$1.out
	mkdir -p "$D/$1"
	chmod 0755 "$D/$1"
	NO_COLOR=1 CLICOLOR=0 pjdfstest -c /etc/pjdfstest.toml -p "$D/$1" "$1" >"$_out" 2>&1
	_rc=$?
	# "NAME   ok|FAILED|skipped|failed as expected", detail lines start with a tab.
	sed 's/\x1b\[[0-9;]*m//g' "$_out" | awk -v group="$1" '
		/^\t/ { if (last != "") detail[last] = detail[last] " " substr($0, 2); next }
		/^[a-z0-9_]+::[a-z0-9_:]+ +(ok|FAILED|skipped|failed as expected)$/ {
			name = $1; st = $0; sub(/^[^ ]+ +/, "", st)
			order[++n] = name; status[name] = st; last = name; next }
		/^Summary:/ { summary = $0 }
		END {
			for (i = 1; i <= n; i++) {
				name = order[i]; d = detail[name]; gsub(/  +/, " ", d)
				if (status[name] == "ok" || status[name] == "failed as expected")
					print "VMTEST PASS pjdfstest:" name
				else if (status[name] == "skipped")
					print "VMTEST INFO pjdfstest:" name " skipped:" d
				else
					print "VMTEST FAIL pjdfstest:" name ":" substr(d, 1, 300)
			}
			if (n == 0) print "VMTEST FAIL pjdfstest-" group ": no test results"
			print "VMTEST INFO pjdfstest " group ": " summary
		}'
	[ $_rc = 0 ] || echo "VMTEST INFO pjdfstest $1 exited with status $_rc; output: $(tail -n 3 "$_out" | tr '\n' ' ' | cut -c1-300)"
}

if command -v pjdfstest >/dev/null; then
	echo "VMTEST INFO $(pjdfstest --version)"
	pjdfstest_group chmod
else
	echo "VMTEST FAIL pjdfstest-binary: no pjdfstest in the guest image (see build-guest.sh: cargo install failed?)"
fi
rm -rf "$D"
