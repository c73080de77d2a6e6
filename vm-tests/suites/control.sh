# Guest side of the control suite: volumes attached and detached at runtime
# through the control socket. The daemon runs with --control-socket and no
# --allowed-dir; control.hook.sh runs `volfsd ctl` on the host when this
# script prints "VMTEST SYNC STEP" (lib.sh: host_step), and answers through
# /mnt/data/.acks/STEP while data is attached.
. /lib/vmtest.sh

WAIT=${WAIT:-60}
D=$M/data
MO=$M/models

# wait_ack STEP: the hook's answer to STEP must be "ok"
wait_ack() {
	wait_until "$WAIT" test -e "$D/.acks/$1"
	_r=$(cat "$D/.acks/$1")
	[ "$_r" = ok ] || die "host step $1: $_r"
}

root_is() { [ "$(ls "$M" | tr '\n' ' ')" = "$1" ]; }

t_empty_root() {
	eq "ls -a /mnt" "$(ls -a "$M" | tr '\n' ' ')" ". .. "
	eq "readdir /mnt" "$(fsops readdir "$M")" 0
	errno ENOENT stat "$D"
	errno EACCES mkdir "$D"
	errno EACCES open "$M/file" wc
}

t_attach_data() {
	host_step attach-data
	wait_ack attach-data
	eq "ls /mnt" "$(ls "$M" | tr '\n' ' ')" "data "
	eq "ls /mnt/data" "$(ls "$D" | tr '\n' ' ')" "hello.txt "
	eq "data/hello.txt" "$(cat "$D/hello.txt")" data-v1
	echo "written by the guest" >"$D/guest-wrote.txt"
	eq "read back" "$(cat "$D/guest-wrote.txt")" "written by the guest"
	host_step check-data-write
	wait_ack check-data-write
}

t_attach_models() {
	host_step attach-models
	wait_ack attach-models
	eq "ls /mnt" "$(ls "$M" | tr '\n' ' ')" "data models "
	eq "models/model.bin" "$(cat "$MO/model.bin")" model-v1
	eq "models/sub/nested.txt" "$(cat "$MO/sub/nested.txt")" "nested model"
	errno EROFS open "$MO/new" wc
	errno EROFS open "$MO/model.bin" w
	errno EROFS open "$MO/model.bin" a
	errno EROFS open "$MO/model.bin" wt
	errno EROFS truncate "$MO/model.bin" 0
	errno EROFS mkdir "$MO/newdir"
	errno EROFS unlink "$MO/model.bin"
	errno EROFS rmdir "$MO/sub"
	errno EROFS rename2 none "$MO/model.bin" "$MO/renamed"
	errno EROFS chmod 0600 "$MO/model.bin"
	errno EROFS touch "$MO/model.bin"
	errno EROFS symlink x "$MO/link"
	fails sh -c "echo x >$MO/new2"
	fails sh -c "echo x >>$MO/model.bin"
	eq "models/model.bin after" "$(cat "$MO/model.bin")" model-v1
	eq "ls models after" "$(ls "$MO" | tr '\n' ' ')" "model.bin sub "
	eq "st_dev data vs models" "$([ "$(stat -c %d "$D")" != "$(stat -c %d "$MO")" ] && echo distinct)" distinct
}

t_stats_1() {
	host_step stats-1
	wait_ack stats-1
}

# A process that holds a file in data open and has its cwd there across the
# detach and the re-attach; it acts when the main script touches /tmp/h.goN.
holder() {
	set +e # the reads after the detach are meant to fail
	cd "$D" || exit 1
	exec 3<hello.txt || exit 1
	fsops readfd 3 >/tmp/h.before
	touch /tmp/h.ready
	n=0
	while [ ! -e /tmp/h.go1 ] && [ $n -lt 3000 ]; do usleep 100000; n=$((n + 1)); done
	fsops -e readfd 3 >/tmp/h.read1
	fsops -e readdir . >/tmp/h.cwd-readdir
	fsops -e stat hello.txt >/tmp/h.cwd-stat
	fsops -e open new-after-detach wc >/tmp/h.cwd-create
	touch /tmp/h.done1
	n=0
	while [ ! -e /tmp/h.go2 ] && [ $n -lt 3000 ]; do usleep 100000; n=$((n + 1)); done
	fsops -e readfd 3 >/tmp/h.read2
	fsops readfd 3 >/tmp/h.read2.data 2>&1
	fsops -e stat hello.txt >/tmp/h.cwd-stat2
	exec 3<&-
	cd /
	touch /tmp/h.done2
}

t_detach() {
	(set -x; holder) >/tmp/holder.log 2>&1 &
	# A second holder: a sleeping process with its cwd and an fd in data.
	(cd "$D" && exec sleep 100000 4<guest-wrote.txt) >/dev/null 2>&1 &
	echo $! >/tmp/sleeper.pid
	wait_until 30 test -e /tmp/h.ready
	eq "holder read before detach" "$(cat /tmp/h.before)" data-v1
	host_step detach-data
	wait_until "$WAIT" sh -c "! ls $M | grep -qx data"
	eq "ls /mnt after detach" "$(ls "$M" | tr '\n' ' ')" "models "
	errno ENOENT stat "$D"
	errno ENOENT open "$D/hello.txt" r
	touch /tmp/h.go1
	wait_until 30 test -e /tmp/h.done1
	kill "$(cat /tmp/sleeper.pid)"
	info "after detach: read on the open fd: $(cat /tmp/h.read1); in the old cwd: readdir . -> $(cat /tmp/h.cwd-readdir), stat hello.txt -> $(cat /tmp/h.cwd-stat), create -> $(cat /tmp/h.cwd-create)"
}

t_detached_fd_fails() {
	r=$(cat /tmp/h.read1)
	case "$r" in
	OK) die "read on an fd into the detached volume succeeded" ;;
	E*) ;;
	*) die "no result from the holder: '$r'" ;;
	esac
}

# docs/control-api.md: requests on stale handles fail with ESTALE.
t_detached_fd_estale() { eq "read on an fd into the detached volume" "$(cat /tmp/h.read1)" ESTALE; }

# docs/control-api.md: requests on stale node ids fail with ENOENT.
t_detached_cwd() {
	eq "stat hello.txt in the old cwd" "$(cat /tmp/h.cwd-stat)" ENOENT
	eq "create in the old cwd" "$(cat /tmp/h.cwd-create)" ENOENT
	eq "readdir of the old cwd" "$(cat /tmp/h.cwd-readdir)" ENOENT
}

t_models_after_detach() {
	eq "models/model.bin" "$(cat "$MO/model.bin")" model-v1
	eq "ls models" "$(ls "$MO" | tr '\n' ' ')" "model.bin sub "
	errno EROFS open "$MO/model.bin" w
}

t_reattach() {
	host_step reattach-data
	wait_ack reattach-data
	eq "ls /mnt" "$(ls "$M" | tr '\n' ' ')" "data models "
	eq "ls /mnt/data" "$(ls "$D" | tr '\n' ' ')" "hello.txt v2.txt "
	eq "data/hello.txt" "$(cat "$D/hello.txt")" data-v2
	eq "data/v2.txt" "$(cat "$D/v2.txt")" "new on the host"
	errno ENOENT stat "$D/guest-wrote.txt"
	echo "after reattach" >"$D/guest-wrote-2.txt"
	eq "read back" "$(cat "$D/guest-wrote-2.txt")" "after reattach"
}

# The fd opened before the detach must not reach the re-attached volume.
t_stale_after_reattach() {
	touch /tmp/h.go2
	if ! (wait_until 30 test -e /tmp/h.done2); then
		info "holder stuck: files: $(ls /tmp | grep '^h\.' | tr '\n' ' '); log: $(cat /tmp/holder.log | tr '\n' ' ')"
		for p in $(ps -o pid,args | awk '/fsops|holder|sleep/ && !/awk/ {print $1}'); do
			info "pid $p: $(tr '\0' ' ' </proc/$p/cmdline) state=$(awk '{print $3}' /proc/$p/stat) wchan=$(cat /proc/$p/wchan) stack: $(head -n 8 /proc/$p/stack 2>/dev/null | awk '{print $2}' | tr '\n' ' ')"
		done
		die "the holder did not finish its reads after the re-attach within 30s"
	fi
	info "after re-attach: read on the old fd: $(cat /tmp/h.read2); stat in the old cwd: $(cat /tmp/h.cwd-stat2)"
	case "$(cat /tmp/h.read2)" in
	OK) die "the old fd reads again after re-attach: '$(cat /tmp/h.read2.data)'" ;;
	E*) ;;
	*) die "no result from the holder" ;;
	esac
	ne "stat in the old cwd after re-attach" "$(cat /tmp/h.cwd-stat2)" OK
}

t_stats_2() {
	cat "$D/hello.txt" "$D/v2.txt" >/dev/null
	host_step stats-2
	wait_ack stats-2
}

t_detach_all() {
	host_step detach-all
	wait_until "$WAIT" root_is ""
	eq "ls -a /mnt" "$(ls -a "$M" | tr '\n' ' ')" ". .. "
	errno ENOENT stat "$D"
	errno ENOENT stat "$MO"
}

run root-starts-empty t_empty_root
run attach-data-rw t_attach_data
run attach-models-ro t_attach_models
run stats-after-guest-io t_stats_1
run detach-data-with-open-fd-and-cwd t_detach
run detached-fd-read-fails-cleanly t_detached_fd_fails
run detached-fd-read-is-estale t_detached_fd_estale
run detached-cwd-is-enoent t_detached_cwd
run models-served-after-detach t_models_after_detach
run reattach-shows-current-contents t_reattach
run old-fd-stays-stale-after-reattach t_stale_after_reattach
run stats-after-reattach t_stats_2
run detach-all t_detach_all
