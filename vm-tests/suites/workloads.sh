# Guest side of the workloads suite: what developers run in a sandbox, in order,
# on the share (/mnt/wl), each checked after it ran:
#   untar        GNU tar extracts the source tree from its disk (wl-tree)
#   find         find over the tree, then find -exec stat of every entry (busybox)
#   git-commit   git init, git add -A -f, git commit of the tree
#   git-status   git status --porcelain on the clean tree
#   npm          npm-style storm: every package of a real dependency tree
#                extracted into its nested node_modules place, then the stat
#                and read calls of Node's module resolution (fsops probe)
#   sqlite       SQL_TX transactions of SQL_ROWS inserts each (sqlite3, default
#                rollback journal: journal_mode=delete, synchronous=full)
#   rm           rm -rf of the tree (with its .git)
# The inputs come on two read-only virtio-blk disks that workloads.setup.sh
# attaches: wl-tree (the tree, a tar) and wl-inputs (a tar of params, the
# storm's packages and lists). Around each workload the guest prints
# "VMTEST SYNC start NAME" / "VMTEST SYNC end NAME" and waits for the host
# hook's ack (workloads.hook.sh samples the daemon's CPU time at each), then
# "VMTEST INFO workload NAME wall SECONDS" with its own time. Checks run
# outside the timed part.
. /lib/vmtest.sh

W=$M/wl
ACKS=$W/.acks
IN=/tmp/wl-inputs
OUT=/tmp/wl-out
ACK_TIMEOUT=${ACK_TIMEOUT:-120}
export HOME=/tmp GIT_EXEC_PATH=/usr/lib/git-core GIT_CONFIG_NOSYSTEM=1 \
	GIT_AUTHOR_NAME=vmtest GIT_AUTHOR_EMAIL=vmtest@localhost \
	GIT_COMMITTER_NAME=vmtest GIT_COMMITTER_EMAIL=vmtest@localhost

# disk SERIAL: the /dev/vdX whose virtio serial is SERIAL
disk() {
	for _b in /sys/block/vd*; do
		[ "$(cat "$_b/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/${_b##*/}"; return 0; }
	done
	return 1
}

# The inputs: the virtio_blk module, the two disks, the small tar unpacked
# into the guest's tmpfs. Failures are kept for the inputs-ready check.
load_inputs() {
	mkdir -p "$IN" "$OUT"
	[ -e /sys/module/virtio_blk ] || insmod /lib/modules/virtio_blk.ko || { echo "insmod virtio_blk failed"; return 1; }
	_i=0
	until _tree=$(disk wl-tree) && _inputs=$(disk wl-inputs); do
		_i=$((_i + 1))
		[ $_i -lt 50 ] || { echo "no virtio-blk disks with serials wl-tree and wl-inputs: $(ls /sys/block)"; return 1; }
		usleep 100000
	done
	tar -xf "$_inputs" -C "$IN" || { echo "tar -xf $_inputs failed"; return 1; }
	[ -s "$IN/params" ] || { echo "no params on $_inputs"; return 1; }
}
INPUTS_ERR=$(load_inputs 2>&1) || INPUTS_ERR=${INPUTS_ERR:-failed}
TREE_DEV=$(disk wl-tree)
[ -s "$IN/params" ] && . "$IN/params"
T=$W/${TREE_TOP:-tree}

t_inputs_ready() {
	[ -z "$INPUTS_ERR" ] || die "inputs: $INPUTS_ERR"
	info "workloads inputs: $TREE_PACKAGE $TREE_VERSION cut to $TREE_FILES files ($TREE_DIRS dirs, $TREE_SYMLINKS symlinks, $TREE_BYTES bytes); storm $STORM_PACKAGES packages, $STORM_FILES files, $STORM_PROBE_OPS resolution calls; sqlite $SQL_TX x $SQL_ROWS"
	mkdir -p "$W" "$ACKS"
}

# ack STEP: wait for the hook's answer to STEP in $ACKS (polled every 20 ms,
# so that the wait adds little to the window the host samples)
ack() {
	_deadline=$(($(date +%s) + ACK_TIMEOUT))
	until [ -e "$ACKS/$1" ]; do
		[ "$(date +%s)" -lt $_deadline ] || { echo "VMTEST INFO no ack for $1 within ${ACK_TIMEOUT}s" >/dev/console; return 1; }
		usleep 20000
	done
	[ "$(cat "$ACKS/$1")" = ok ] || echo "VMTEST INFO ack $1: $(cat "$ACKS/$1")" >/dev/console
	return 0
}

# irqs: completions signalled on the share's request queues and on its hiprio
# queue (FORGETs), summed over the vCPUs: "REQUESTS HIPRIO". With one request in
# flight at a time (TCG, one vCPU) nearly every request gets its own interrupt,
# so the difference across a workload counts its requests on either daemon.
irqs() {
	awk '/virtio[0-9]+-(requests|hiprio)/ {
		s = 0
		for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i
		if ($NF ~ /hiprio/) h += s; else r += s
	} END {printf "%d %d", r, h}' /proc/interrupts
}

# timed NAME FUNC: FUNC between the hook's start and end samples, its output
# and exit status kept in $OUT/NAME.{out,rc} for the check that follows.
timed() {
	_wl=$1
	host_step "start $_wl"
	ack "start-$_wl" || echo "no start ack" >"$OUT/$_wl.noack"
	_i0=$(irqs)
	_t0=$(now)
	(set -e; "$2") >"$OUT/$_wl.out" 2>&1
	echo $? >"$OUT/$_wl.rc"
	_t1=$(now)
	_i1=$(irqs)
	host_step "end $_wl"
	ack "end-$_wl" || echo "no end ack" >>"$OUT/$_wl.noack"
	echo "VMTEST INFO workload $_wl wall $(awk "BEGIN {printf \"%.3f\", $_t1 - $_t0}")s"
	echo "VMTEST INFO workload $_wl interrupts $(echo "$_i0 $_i1" | awk '{print $3 - $1, $4 - $2}')"
}

# ran NAME: the timed part exited 0 and both samples were taken
ran() {
	[ ! -e "$OUT/$1.noack" ] || die "$1: the host hook did not ack ($(tr '\n' ' ' <"$OUT/$1.noack"))"
	[ "$(cat "$OUT/$1.rc")" = 0 ] || die "$1 failed (status $(cat "$OUT/$1.rc")): $(tail -n 3 "$OUT/$1.out" | tr '\n' ' ')"
}

# ---------------------------------------------------------------- workloads

w_untar() { gtar -xf "$TREE_DEV" -C "$W"; }
c_untar() {
	ran untar
	eq "entries under the tree" "$(find "$T" | wc -l)" $((TREE_FILES + TREE_DIRS + TREE_SYMLINKS))
}

# (find -exec ... {} +, not xargs -0: busybox 1.35's xargs -0 splices names
# when its input is long)
w_find() {
	find "$T" >"$OUT/find.list"
	find "$T" -exec stat -c '%F %s' {} + >"$OUT/stat.list"
}
c_find() {
	ran find
	eq "find: entries" "$(wc -l <"$OUT/find.list")" $((TREE_FILES + TREE_DIRS + TREE_SYMLINKS))
	eq "stat: regular files" "$(grep -c '^regular' "$OUT/stat.list")" "$TREE_FILES"
	eq "stat: directories" "$(grep -c '^directory' "$OUT/stat.list")" "$TREE_DIRS"
	eq "stat: symbolic links" "$(grep -c '^symbolic link' "$OUT/stat.list")" "$TREE_SYMLINKS"
	eq "stat: bytes of the regular files" "$(awk '/^regular/ {s += $NF} END {printf "%d", s}' "$OUT/stat.list")" "$TREE_BYTES"
}

w_git_commit() {
	cd "$T"
	git init -q
	# -f: the kernel tree tracks files its own .gitignore matches (its dotfiles)
	git add -A -f
	git commit -q -m "$TREE_PACKAGE $TREE_VERSION, first $TREE_FILES files"
}
c_git_commit() {
	ran git-commit
	cd "$T"
	eq "files in the commit" "$(git ls-tree -r HEAD | wc -l)" $((TREE_FILES + TREE_SYMLINKS))
}

w_git_status() {
	cd "$T"
	git status --porcelain >"$OUT/git-status.list"
}
c_git_status() {
	ran git-status
	[ ! -s "$OUT/git-status.list" ] || die "git status is not clean: $(head -n 5 "$OUT/git-status.list" | tr '\n' ' ')"
}

# Each package extracted where npm put it (nested node_modules included), with
# busybox tar (gunzip in-process: no extra fork per package), then the module
# resolution of every dependency of every package.
w_npm() {
	_app=$W/storm/app
	mkdir -p "$_app"
	cp "$IN/package.json" "$_app/package.json"
	while read -r _n _path; do
		mkdir -p "$_app/$_path"
		tar -xzf "$IN/npm/$_n.tgz" -C "$_app/$_path" --strip-components=1
	done <"$IN/layout"
	fsops probe "$IN/probes" "$W/storm" >"$OUT/probe.txt"
}
c_npm() {
	ran npm
	info "npm storm resolution: $(cat "$OUT/probe.txt")"
	eq "resolution calls replayed" "$(awk '{print $2}' "$OUT/probe.txt")" "$STORM_PROBE_OPS"
	cd "$W/storm"
	_bad=$(sha256sum -c "$IN/manifest" 2>&1 | grep -v ': OK$' | head -n 3 | tr '\n' ' ')
	[ -z "$_bad" ] || die "storm files read back wrong: $_bad"
	eq "storm files" "$(find app/node_modules -type f | wc -l)" "$STORM_FILES"
}

SQL=/tmp/wl-inserts.sql
w_sqlite() {
	mkdir -p "$W/sqlite"
	sqlite3 "$W/sqlite/test.db" <"$SQL"
}
c_sqlite() {
	ran sqlite
	_db=$W/sqlite/test.db
	eq "journal mode" "$(sqlite3 "$_db" 'PRAGMA journal_mode;')" delete
	eq "rows, sum of tx" "$(sqlite3 "$_db" 'SELECT count(*), sum(tx) FROM t;')" "$((SQL_TX * SQL_ROWS))|$((SQL_ROWS * SQL_TX * (SQL_TX + 1) / 2))"
	eq "integrity" "$(sqlite3 "$_db" 'PRAGMA integrity_check;')" ok
	[ ! -e "$_db-journal" ] || die "a rollback journal was left behind"
}

w_rm() { rm -rf "$T"; }
c_rm() {
	ran rm
	[ ! -e "$T" ] || die "$T still exists"
	for _e in "$W"/*; do
		[ "$_e" != "$T" ] || die "$T still listed in $W"
	done
}

# The SQL script, made before the timed part: SQL_TX transactions of SQL_ROWS
# inserts each.
make_sql() {
	awk -v T="$SQL_TX" -v R="$SQL_ROWS" 'BEGIN {
		print "CREATE TABLE t(id INTEGER PRIMARY KEY, tx INTEGER, name TEXT, body TEXT);"
		for (t = 1; t <= T; t++) {
			print "BEGIN;"
			for (r = 1; r <= R; r++)
				printf "INSERT INTO t(tx, name, body) VALUES(%d, \047row-%d-%d\047, hex(randomblob(64)));\n", t, t, r
			print "COMMIT;"
		}
	}' >"$SQL"
}

run inputs-ready t_inputs_ready
if [ -z "$INPUTS_ERR" ]; then
	timed untar w_untar
	run untar c_untar
	timed find w_find
	run find c_find
	timed git-commit w_git_commit
	run git-commit c_git_commit
	timed git-status w_git_status
	run git-status c_git_status
	timed npm w_npm
	run npm c_npm
	make_sql
	timed sqlite w_sqlite
	run sqlite c_sqlite
	timed rm w_rm
	run rm c_rm
	# Not a workload: the storm and the database go, untimed.
	rm -rf "$W/storm" "$W/sqlite"
fi
