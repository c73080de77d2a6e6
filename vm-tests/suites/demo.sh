# Guest side of vm-tests/demo.sh: read a file the host put in the share,
# write one back. Runs under busybox sh with the share mounted at /mnt.
. /lib/vmtest.sh

read_host_file() {
	info "guest reads /mnt/hello-from-host.txt: $(cat /mnt/hello-from-host.txt)"
	eq "host file" "$(cat /mnt/hello-from-host.txt)" "hello from the host"
}

write_guest_file() {
	echo "hello from the guest ($(uname -sr), $(nproc) cpus)" >/mnt/hello-from-guest.txt
	info "guest wrote /mnt/hello-from-guest.txt: $(cat /mnt/hello-from-guest.txt)"
}

run demo-read-host-file read_host_file
run demo-write-guest-file write_guest_file
