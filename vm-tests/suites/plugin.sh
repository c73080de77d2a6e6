# Guest side of the plugin suite (vm-tests/run-plugin.sh): a JuiceFS volume
# attached at runtime by a node agent through the reference volume plugin
# (plugin.hook.sh), used, shared with a second sandbox's attach, and detached.
. /lib/vmtest.sh

V=$M/vol

wait_ack() { # wait_ack STEP: the hook's answer in the volume
	wait_until 120 test -e "$V/.acks/$1" || die "no ack for $1"
	eq "hook's answer to $1" "$(cat "$V/.acks/$1")" ok
}

t_attach() {
	eq "volumes before the attach" "$(ls "$M" | tr '\n' ' ')" ""
	host_step attach
	wait_ack attach
	eq "file the node wrote" "$(cat "$V/from-node.txt")" "written on the node before the attach"
	head -c 1048576 /dev/urandom >"$V/guest.bin"
	sha "$V/guest.bin" >"$V/guest.bin.sha256"
	eq "read back" "$(sha "$V/guest.bin")" "$(cat "$V/guest.bin.sha256")"
}

# A second sandbox's attach and detach (refCount 1) leave this one's volume alone.
t_second_sandbox() {
	exec 3<"$V/guest.bin" # an open file across the other sandbox's attach/detach
	host_step second
	wait_ack second
	eq "read after the second sandbox came and went" "$(sha "$V/guest.bin")" "$(cat "$V/guest.bin.sha256")"
	eq "read on the fd held across it" "$(head -c 1048576 <&3 | sha256sum | cut -d' ' -f1)" "$(cat "$V/guest.bin.sha256")"
	exec 3<&-
	echo after-second >"$V/after-second.txt"
	eq "write after it" "$(cat "$V/after-second.txt")" after-second
}

t_detach() {
	host_step detach
	wait_until 120 test -e "$M/detach-done/.acks/detach" || die "no ack for detach"
	eq "hook's answer to detach" "$(cat "$M/detach-done/.acks/detach")" ok
	[ ! -e "$V" ] || die "vol still visible after the detach"
	eq "volumes after the detach" "$(ls "$M" | tr '\n' ' ')" "detach-done "
}

run attach t_attach
run second-sandbox t_second_sandbox
run detach t_detach
