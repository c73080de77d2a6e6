#!/usr/bin/env bash
# End-to-end test with the real libvirt: Debian's libvirtd starts volfsd for a
# domain's virtio-fs <filesystem>, with the argument vector libvirt builds
# itself, and the test guest (build/guest) uses the share (the demo suite:
# the guest reads a file the host created and writes one back).
#
# Run as root. It
#   - installs libvirt-daemon (libvirtd and its QEMU driver) and
#     libvirt-clients (virsh) with --no-install-recommends, and
#     qemu-system-x86, if missing. Not libvirt-daemon-system: that one only adds
#     the system services (systemd/sysv), default configs, polkit and
#     firewall rules, and the libvirt-qemu user; this test brings its own
#     configs, and the user only in its libvirtd's view of /etc/passwd;
#   - builds the guest (build-guest.sh; cached);
#   - copies the daemon into its temp dir (the binary stays the same while
#     target/ is rebuilt) and makes libvirt find it the way a distribution
#     would: a vhost-user backend descriptor {"type": "fs", "binary": ...}
#     (QEMU's docs/interop/vhost-user.json) in /etc/qemu/vhost-user/, removed at
#     the end (--route descriptor, the default), or <binary path='...'/> in the
#     domain XML (--route binary-path);
#   - starts a private libvirtd in its own mount namespace: there
#     /etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and
#     /var/log/libvirt are bind mounts of dirs in the temp dir (and
#     /etc/passwd, /etc/group of copies with a libvirt-qemu entry), so it uses
#     this test's libvirtd.conf and qemu.conf and leaves the host's libvirt (if
#     any) alone. virsh talks to it through its socket
#     (qemu+unix:///system?socket=...);
#   - starts a transient domain (virsh create) of type 'qemu' (TCG): direct
#     kernel boot of build/guest/vmlinuz + initramfs.cpio.gz with run-vm.sh's
#     command line for the demo suite, memfd memory with shared access, one
#     <filesystem type='mount' accessmode='passthrough'> with
#     <driver type='virtiofs' queue='1024'/>, <binary xattr='on'> (cache none,
#     namespace sandbox, posix and flock locks, thread pool 2), source = a fresh
#     share, target dir (the mount tag) 'share' as the guest's /init mounts it,
#     serial console to LOG_DIR/serial.log;
#   - waits for "VMTEST DONE" (or --timeout), prints the guest's results and
#     its own checks:
#       libvirt-started-volfsd   the process libvirt started for the filesystem
#                                (its pid file) is our binary; its argv from
#                                /proc/PID/cmdline is logged (LOG_DIR/
#                                volfsd-argv.txt) and shown as a VMTEST INFO line
#       libvirt-argv-form        which form libvirt used: virtiofsd's "-o
#                                source=...,cache=..." string or separate
#                                options (--shared-dir ...); volfsd's
#                                --print-capabilities lists "separate-options"
#       demo-host-sees-guest-file  suites/demo.host.sh on the share
#       volfsd-exits-with-the-domain  once the guest powered off (or after
#                                `virsh destroy`) no volfsd process is left and
#                                no socket is left
#     and ends with "N passed, N failed".
# Debian 12's libvirt 9.0.0 runs (one argument per word; N is the listening
# socket libvirt made and passed):
#   BINARY --fd=N -o source=SHARE,cache=none,sandbox=namespace,xattr,flock,posix_lock --thread-pool-size=2
# i.e. virtiofsd's -o form: libvirt 9.0 neither reads the descriptor's nor the
# binary's capabilities for fs (--print-capabilities is only run for
# vhost-user-gpu) and has no separate-options form.
# A boot that never reaches /init (TCG oopses in early boot now and then) is
# retried once; a suite that ran is never retried. VMTEST_BREAK_BOOTS=1 makes
# the first boot fail (rdinit=/bin/false), to test the retry.
#
# Usage: sudo vm-tests/run-libvirt.sh [options]
#   --daemon PATH     volfsd binary (default target/release/volfsd)
#   --log-dir DIR     logs (default build/vm-logs/libvirt): serial.log,
#                     libvirtd.log, domain.xml, qemu-domain.log (libvirt's
#                     QEMU log: the QEMU command line), volfsd.log (the daemon's
#                     output as libvirt captured it), volfsd-argv.txt
#   --route descriptor|binary-path   how libvirt finds volfsd (default descriptor)
#   --descriptor-name NAME  the descriptor's file name in /etc/qemu/vhost-user
#                     (default 40-volfsd.json; see DESCRIPTOR_NAME below for
#                     why not 50-volfsd.json)
#   --stop poweroff|destroy  how the domain ends after VMTEST DONE: the guest's
#                     own poweroff (default), or `virsh destroy` at once
#   --timeout SECS    bound on the guest run (default 600)
#   --keep            keep the temp dir (share, libvirt state) and the domain's
#                     files
# Exit status: 0 only if every check passed.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=runner-lib.sh
. "$HERE/runner-lib.sh"

DAEMON="$REPO/target/release/volfsd"
LOG_DIR="$REPO/build/vm-logs/libvirt"
ROUTE=descriptor
STOP=poweroff
TIMEOUT=600
KEEP=0
BOOT_TIMEOUT=180 # seconds from `virsh create` to the guest's VMTEST INIT
BOOT_ATTEMPTS=2  # a boot that never reached /init is retried once
POWEROFF_TIMEOUT=60
SUITE=demo
# The descriptor's name decides whether libvirt picks it: libvirt 9 takes the
# first "fs" descriptor in file-name order over /usr/share/qemu/vhost-user and
# /etc/qemu/vhost-user (a name in /etc replaces the same name in /usr/share),
# and Debian 12's qemu-system-common ships
# /usr/share/qemu/vhost-user/50-qemu-virtiofsd.json (QEMU 7.2's C virtiofsd):
# "50-volfsd.json" sorts after it and loses; "40-volfsd.json" comes first.
DESCRIPTOR_NAME=40-volfsd.json
VHOST_USER_DIRS=(/usr/share/qemu/vhost-user /etc/qemu/vhost-user)

WORK=""
LIBVIRTD_PID=""
DOMAIN="volfsd-libvirt-$$"
VIRSH=()
DESCRIPTOR=""          # the descriptor this script installed
SAVED_DESCRIPTOR=""    # a file of that name that was there before
CREATED_DIRS=()        # dirs this script created on the host (removed at the end)
BIN=""                 # the copy of the daemon libvirt runs

PASSED=0
FAILED=0
GUEST_DONE=0

say() { echo "run-libvirt: $*"; }
die() {
	echo "run-libvirt: error: $*" >&2
	exit 2
}

usage() {
	sed -n '2,76p' "$0" | sed 's/^# \{0,1\}//'
	exit "${1:-0}"
}

parse_args() {
	while [[ $# -gt 0 ]]; do
		case "$1" in
		--daemon) DAEMON=${2:?}; shift ;;
		--log-dir) LOG_DIR=${2:?}; shift ;;
		--route) ROUTE=${2:?}; shift ;;
		--descriptor-name) DESCRIPTOR_NAME=${2:?}; shift ;;
		--stop) STOP=${2:?}; shift ;;
		--timeout) TIMEOUT=${2:?}; shift ;;
		--keep) KEEP=1 ;;
		-h | --help) usage 0 ;;
		*) echo "run-libvirt: unknown option: $1" >&2; usage 2 ;;
		esac
		shift
	done
	case "$ROUTE" in descriptor | binary-path) ;; *) die "--route must be descriptor or binary-path" ;; esac
	case "$STOP" in poweroff | destroy) ;; *) die "--stop must be poweroff or destroy" ;; esac
	[[ $DESCRIPTOR_NAME =~ ^[A-Za-z0-9][A-Za-z0-9._-]*\.json$ ]] || die "--descriptor-name must be a file name ending in .json"
	[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a number of seconds"
	[[ -x $DAEMON ]] || die "daemon '$DAEMON' is not an executable (cargo build --release, or pass --daemon)"
	DAEMON=$(readlink -f "$DAEMON")
}

# ---------------------------------------------------------------- results

info() { echo "  VMTEST INFO $*"; }



# ---------------------------------------------------------------- host setup


make_dir() { # make_dir DIR: mkdir -p, remembering each dir it created
	local d=$1 todo=()
	while [[ ! -d $d ]]; do
		todo=("$d" "${todo[@]}")
		d=$(dirname "$d")
	done
	for d in "${todo[@]}"; do
		mkdir "$d" || die "mkdir $d failed"
		CREATED_DIRS+=("$d")
	done
}

install_descriptor() {
	local dir=/etc/qemu/vhost-user
	make_dir "$dir"
	DESCRIPTOR="$dir/$DESCRIPTOR_NAME"
	if [[ -e $DESCRIPTOR ]]; then
		SAVED_DESCRIPTOR="$WORK/saved-$DESCRIPTOR_NAME"
		cp -a "$DESCRIPTOR" "$SAVED_DESCRIPTOR"
		say "$DESCRIPTOR exists; saved it, restored at the end"
	fi
	cat >"$DESCRIPTOR" <<EOF
{
  "description": "volfsd vhost-user virtio-fs backend (run-libvirt.sh test)",
  "type": "fs",
  "binary": "$BIN"
}
EOF
	say "installed the vhost-user descriptor $DESCRIPTOR -> $BIN"
	# The order libvirt 9 reads the fs descriptors in (file name order, /etc
	# over /usr/share for the same name): the first one is used.
	local order
	order=$(for d in "${VHOST_USER_DIRS[@]}"; do
		[[ -d $d ]] && find "$d" -maxdepth 1 \( -type f -o -type l \) ! -name '.*' -printf '%f %p\n'
	done | sort -k1,1 -s | awk '{p[$1] = $2; if (!($1 in seen)) {seen[$1] = 1; o[++n] = $1}}
		END {for (i = 1; i <= n; i++) print p[o[i]]}' |
		while read -r f; do
			# Descriptors of other types (QEMU's own 50-qemu-gpu.json) are skipped;
			# the loop's status must not be the last grep's.
			if [[ -s $f ]] && grep -q '"type" *: *"fs"' "$f"; then printf '%s ' "$f"; fi
		done)
	info "fs descriptors in libvirt's order (the first wins): $order"
}

remove_descriptor() {
	[[ -n $DESCRIPTOR ]] || return 0
	rm -f "$DESCRIPTOR"
	if [[ -n $SAVED_DESCRIPTOR && -e $SAVED_DESCRIPTOR ]]; then
		cp -a "$SAVED_DESCRIPTOR" "$DESCRIPTOR"
	fi
	DESCRIPTOR=""
}

# ---------------------------------------------------------------- libvirtd

# The mount points of the private libvirtd's state (host dirs; created if
# missing and then removed at the end, the namespace binds over them).
STATE_DIRS=(etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt cache:/var/cache/libvirt log:/var/log/libvirt)

write_libvirt_config() {
	local s
	for s in "${STATE_DIRS[@]}"; do
		mkdir -p "$WORK/${s%%:*}"
		make_dir "${s#*:}"
	done
	mkdir -p "$WORK/etc/qemu" "$WORK/log/qemu" "$WORK/lib/qemu" "$WORK/run/qemu" "$WORK/cache/qemu"
	# libvirt 9's QEMU driver resolves its built-in default user and group
	# (Debian: libvirt-qemu) before it reads qemu.conf, and fails if they do
	# not exist. libvirt-daemon-system's postinst would create them; this test
	# adds them only to copies of /etc/passwd and /etc/group that its
	# libvirtd's namespace sees. QEMU and volfsd still run as root (qemu.conf).
	cp /etc/passwd "$WORK/passwd"
	cp /etc/group "$WORK/group"
	local id=64055
	while getent passwd "$id" >/dev/null || getent group "$id" >/dev/null; do id=$((id + 1)); done
	getent group libvirt-qemu >/dev/null || echo "libvirt-qemu:x:$id:" >>"$WORK/group"
	getent passwd libvirt-qemu >/dev/null ||
		echo "libvirt-qemu:x:$id:$id:Libvirt Qemu (run-libvirt.sh):/var/lib/libvirt:/usr/sbin/nologin" >>"$WORK/passwd"
	cat >"$WORK/etc/libvirtd.conf" <<EOF
# Private libvirtd of vm-tests/run-libvirt.sh (seen as /etc/libvirt/libvirtd.conf
# in its mount namespace).
# Only root uses the socket; no polkit (there is no D-Bus/polkitd here).
unix_sock_rw_perms = "0700"
unix_sock_ro_perms = "0700"
auth_unix_rw = "none"
auth_unix_ro = "none"
# Warnings and errors of everything, and the debug messages that show the
# vhost-user descriptors libvirt read, how it starts virtiofsd, and every
# command line it runs (util.command: the virtiofsd argv among them).
log_level = 3
log_filters = "1:qemu.qemu_vhost_user 1:qemu.qemu_configs 1:qemu.qemu_virtiofs 1:util.command 2:qemu.qemu_process"
log_outputs = "1:file:$LOG_DIR/libvirtd.log"
EOF
	cat >"$WORK/etc/qemu.conf" <<'EOF'
# QEMU driver settings of vm-tests/run-libvirt.sh's private libvirtd (seen as
# /etc/libvirt/qemu.conf in its mount namespace). This machine is a container
# without systemd, D-Bus, AppArmor/SELinux or the libvirt-qemu user
# (libvirt-daemon-system is not installed), so:
#
# QEMU (and the vhost-user daemons libvirt starts, virtiofsd/volfsd) run as
# root, as run-vm.sh runs them; Debian's default user libvirt-qemu does not
# exist here.
user = "root"
group = "root"
# Do not chown the kernel, initramfs, share or logs to the QEMU user (it is
# root anyway), and do not record owners in xattrs.
dynamic_ownership = 0
remember_owner = 0
# No AppArmor/SELinux confinement (none is available in the container; the
# Debian default would try AppArmor's virt-aa-helper).
security_driver = "none"
# QEMU's stdout/stderr go straight to /var/log/libvirt/qemu/DOMAIN.log instead
# of through virtlogd (one daemon less to run; same log content).
stdio_handler = "file"
# No cgroup placement: the container's cgroup hierarchy is not libvirt's to
# manage (no systemd-machined either).
cgroup_controllers = [ ]
# No private /dev mount namespace for QEMU (libvirt would populate a tmpfs /dev
# with device nodes; not needed here and fragile in a container).
namespaces = [ ]
EOF
}

start_libvirtd() {
	write_libvirt_config
	# Own mount namespace: the binds are seen only by libvirtd and what it
	# starts (QEMU, volfsd). Own session (setsid), so that a Ctrl-C meant for
	# this script does not stop libvirtd before the cleanup destroyed the
	# domain. setsid (not a group leader here) and unshare without --fork
	# exec: $! is libvirtd.
	setsid unshare --mount --propagation private -- /bin/sh -c '
		set -e
		W=$1
		mount --bind "$W/etc" /etc/libvirt
		mount --bind "$W/run" /run/libvirt
		mount --bind "$W/lib" /var/lib/libvirt
		mount --bind "$W/cache" /var/cache/libvirt
		mount --bind "$W/log" /var/log/libvirt
		mount --bind "$W/passwd" /etc/passwd
		mount --bind "$W/group" /etc/group
		exec libvirtd -f /etc/libvirt/libvirtd.conf -p "$W/libvirtd.pid"
	' sh "$WORK" >"$LOG_DIR/libvirtd.out" 2>&1 &
	LIBVIRTD_PID=$!
	VIRSH=(virsh -q -c "qemu+unix:///system?socket=$WORK/run/libvirt-sock")
	local i
	for i in $(seq 120); do
		if [[ -S $WORK/run/libvirt-sock ]] && "${VIRSH[@]}" uri >/dev/null 2>&1; then
			say "private libvirtd (pid $LIBVIRTD_PID) up after $((i / 2))s: $("${VIRSH[@]}" version --daemon 2>/dev/null | grep -i 'daemon' | tr -s ' ' | paste -sd';')"
			return 0
		fi
		kill -0 "$LIBVIRTD_PID" 2>/dev/null || break
		sleep 0.5
	done
	show_tail "$LOG_DIR/libvirtd.out" "libvirtd output"
	show_tail "$LOG_DIR/libvirtd.log" "libvirtd log"
	die "the private libvirtd did not come up"
}


domain_running() { [[ -n ${VIRSH[*]} ]] && "${VIRSH[@]}" domid "$DOMAIN" >/dev/null 2>&1; }

# Processes running our copy of the daemon (none may be left at the end).
daemon_pids() {
	local p exe
	[[ -n $BIN ]] || return 0
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		[[ $exe == "$BIN" || $exe == "$BIN (deleted)" ]] && echo "${p#/proc/}"
	done
	return 0
}

# QEMU processes of our domain (libvirt daemonizes them away from libvirtd).
qemu_pids() {
	local p
	for p in /proc/[0-9]*; do
		tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q -- "-name guest=$DOMAIN," && echo "${p#/proc/}"
	done
	return 0
}

cleanup() {
	local p d i
	if domain_running; then
		"${VIRSH[@]}" destroy "$DOMAIN" >/dev/null 2>&1 || true
	fi
	stop_pid "$LIBVIRTD_PID" 10
	# Whatever libvirt started for this domain and left behind.
	for p in $(qemu_pids) $(daemon_pids); do
		say "stopping leftover process $p ($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-100))"
		stop_pid "$p" 10
	done
	remove_descriptor
	for ((i = ${#CREATED_DIRS[@]} - 1; i >= 0; i--)); do
		d=${CREATED_DIRS[i]}
		rmdir "$d" 2>/dev/null || say "left $d (not empty)"
	done
	if [[ -n $WORK && $KEEP == 0 ]]; then
		rm -rf "$WORK"
	elif [[ -n $WORK ]]; then
		say "kept $WORK"
	fi
}

# ---------------------------------------------------------------- domain

KERNEL="$REPO/build/guest/vmlinuz"
INITRD="$REPO/build/guest/initramfs.cpio.gz"

write_domain_xml() { # write_domain_xml FILE SERIAL ATTEMPT
	local binary_attrs="xattr='on'" extra=""
	# VMTEST_BREAK_BOOTS=N (as in run-vm.sh, to test the retry): the first N
	# boots get an init that exits at once, so they never reach /init.
	(($3 > ${VMTEST_BREAK_BOOTS:-0})) || extra=" rdinit=/bin/false"
	[[ $ROUTE == descriptor ]] || binary_attrs="path='$BIN' xattr='on'"
	cat >"$1" <<EOF
<domain type='qemu'>
  <name>$DOMAIN</name>
  <memory unit='MiB'>1024</memory>
  <!-- vhost-user needs guest RAM the daemon can map: memfd, shared -->
  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>$KERNEL</kernel>
    <initrd>$INITRD</initrd>
    <!-- run-vm.sh's command line for the demo suite; /init mounts tag 'share' -->
    <cmdline>console=ttyS0 panic=-1 quiet vmtest.suite=$SUITE$extra</cmdline>
  </os>
  <!-- ACPI: the guest's poweroff -f ends the VM -->
  <features><acpi/><apic/></features>
  <!-- like run-vm.sh's -no-reboot: a reboot or panic ends the domain -->
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      <binary $binary_attrs>
        <cache mode='none'/>
        <sandbox mode='namespace'/>
        <lock posix='on' flock='on'/>
        <thread_pool size='2'/>
      </binary>
      <source dir='$SHARE'/>
      <target dir='share'/>
    </filesystem>
    <serial type='file'>
      <source path='$2' append='off'/>
      <target port='0'/>
    </serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
EOF
}

# The process libvirt started for the filesystem: its pid file
# (/run/libvirt/qemu/ID-NAME-fs0-fs.pid in libvirtd's namespace).
VOLFSD_PID=""
VOLFSD_ARGV=()
SOCKETS=""
record_daemon() {
	local pidfile i
	VOLFSD_PID="" VOLFSD_ARGV=() VOLFSD_EXE="" VOLFSD_SUPERVISOR_EXE=""
	for i in $(seq 50); do
		# libvirt 9: /run/libvirt/qemu/ID-SHORTNAME-fs0-fs.pid (the short
		# name is cut at 20 characters); this libvirtd runs only this domain.
		pidfile=$(find "$WORK/run/qemu" -maxdepth 1 \( -name "*-fs.pid" -o -name "*-virtiofsd.pid" \) 2>/dev/null | head -n 1)
		[[ -n $pidfile && -s $pidfile ]] && break
		sleep 0.1
	done
	if [[ -n $pidfile && -s $pidfile ]]; then
		VOLFSD_PID=$(tr -dc '0-9' <"$pidfile")
		say "libvirt's pid file /run/libvirt${pidfile#"$WORK/run"}: $VOLFSD_PID"
	else
		say "no virtiofsd pid file under /run/libvirt/qemu"
	fi
	if [[ -n $VOLFSD_PID && -r /proc/$VOLFSD_PID/cmdline ]]; then
		mapfile -d '' -t VOLFSD_ARGV <"/proc/$VOLFSD_PID/cmdline"
		VOLFSD_EXE=$(readlink "/proc/$VOLFSD_PID/exe" 2>/dev/null || true)
		# The namespace sandbox's supervisor keeps libvirt's pid and volfsd's argv but
		# runs the tiny program volfsd executes from a memfd (docs/SECURITY.md): the
		# binary is then its serving child's.
		if [[ $VOLFSD_EXE == /memfd:volfsd-supervisor* ]]; then
			local child
			child=$(cat "/proc/$VOLFSD_PID/task/$VOLFSD_PID/children" 2>/dev/null | awk '{print $1}')
			VOLFSD_SUPERVISOR_EXE=$VOLFSD_EXE
			VOLFSD_EXE=$(readlink "/proc/${child:-0}/exe" 2>/dev/null || true)
		fi
	fi
	# The vhost-user socket libvirt made for the filesystem
	# (/var/lib/libvirt/qemu/domain-ID-NAME/fs0-fs.sock; /var/lib/libvirt is
	# $WORK/lib as the host sees it).
	SOCKETS=$(find "$WORK/lib/qemu" -type s -name '*-fs.sock' 2>/dev/null | paste -sd' ')
}

argv_string() { # the argv, shell-quoted where needed
	local a out=""
	for a in "$@"; do
		if [[ $a =~ ^[A-Za-z0-9_./=,:@+-]+$ ]]; then out+="$a "; else out+="$(printf '%q' "$a") "; fi
	done
	echo "${out% }"
}

check_daemon() {
	local argv
	argv=$(argv_string "${VOLFSD_ARGV[@]}")
	{
		echo "libvirt $LIBVIRT_VERSION, domain $DOMAIN, route $ROUTE"
		if [[ -n $VOLFSD_SUPERVISOR_EXE ]]; then
			echo "pid $VOLFSD_PID exe $VOLFSD_SUPERVISOR_EXE (the sandbox supervisor), its serving child's exe $VOLFSD_EXE"
		else
			echo "pid $VOLFSD_PID exe $VOLFSD_EXE"
		fi
		echo "argv: $argv"
		echo "argv, one per line:"
		printf '  %s\n' "${VOLFSD_ARGV[@]}"
	} >"$LOG_DIR/volfsd-argv.txt"
	if [[ -z $VOLFSD_PID ]]; then
		fail libvirt-started-volfsd "libvirt wrote no virtiofsd pid file for the domain"
		return
	fi
	info "libvirt $LIBVIRT_VERSION started: $argv"
	if [[ $ROUTE == descriptor ]]; then
		info "route descriptor: the domain XML has no binary path; the live XML says $(grep -o "<binary path='[^']*'" "$LOG_DIR/domain-live.xml" 2>/dev/null | head -n 1 || echo '(no live XML)')>"
	fi
	if [[ $VOLFSD_EXE == "$BIN" ]]; then
		[[ -n $VOLFSD_SUPERVISOR_EXE ]] && info "libvirt's pid is volfsd's sandbox supervisor ($VOLFSD_SUPERVISOR_EXE); its serving child runs $BIN"
		pass libvirt-started-volfsd
	else
		fail libvirt-started-volfsd "the process in libvirt's pid file (pid $VOLFSD_PID) runs '${VOLFSD_EXE:-?}' ($argv), not $BIN"
		return
	fi
	local a form="" opts=""
	for ((a = 1; a < ${#VOLFSD_ARGV[@]}; a++)); do
		case "${VOLFSD_ARGV[a]}" in
		-o) form=o; opts=${VOLFSD_ARGV[a + 1]:-} ;;
		-o*) form=o; opts=${VOLFSD_ARGV[a]#-o} ;;
		--shared-dir | --shared-dir=*) [[ -n $form ]] || form=separate ;;
		esac
	done
	case "$form" in
	o)
		info "libvirt used virtiofsd's -o form (not separate options): -o $opts"
		pass libvirt-argv-form
		;;
	separate)
		info "libvirt used the separate-options form (--shared-dir ...)"
		pass libvirt-argv-form
		;;
	*)
		fail libvirt-argv-form "neither -o source=... nor --shared-dir in: $argv"
		;;
	esac
	info "volfsd --print-capabilities: $("$BIN" --print-capabilities 2>&1 | tr -d '\n' | tr -s ' ')"
}

boot_state() { # 0: reached /init; 1: not yet
	tr -d '\r' <"$SERIAL" 2>/dev/null | grep -aq '^VMTEST INIT'
}

PRINTED=0
print_progress() {
	local lines
	lines=$(serial_results "$SERIAL" | wc -l)
	if ((lines > PRINTED)); then
		serial_results "$SERIAL" | sed -n "$((PRINTED + 1)),${lines}p" |
			grep -v -e '^VMTEST INIT$' -e '^VMTEST DONE$' -e '^VMTEST PASS ' -e '^VMTEST FAIL ' | sed 's/^/  /' || true
		PRINTED=$lines
	fi
}

# One boot: 0 when the guest reached /init (suite ran, or timed out), 1 when
# it never did (retry).
run_domain() { # run_domain ATTEMPT
	local attempt=$1 xml="$LOG_DIR/domain.xml" t0 out
	: >"$SERIAL"
	write_domain_xml "$xml" "$SERIAL" "$attempt"
	t0=$SECONDS
	if ! out=$("${VIRSH[@]}" create "$xml" 2>&1); then
		fail libvirt-create "virsh create failed: $(tr '\n' ' ' <<<"$out")"
		collect_logs
		show_tail "$LOG_DIR/libvirtd.log" "libvirtd log"
		show_tail "$LOG_DIR/qemu-domain.log" "libvirt's QEMU log of the domain"
		show_tail "$LOG_DIR/volfsd.log" "volfsd's output (as libvirt captured it)"
		return 2
	fi
	say "boot $attempt: domain $DOMAIN created in $((SECONDS - t0))s"
	record_daemon
	[[ $attempt -gt 1 ]] || "${VIRSH[@]}" dumpxml "$DOMAIN" >"$LOG_DIR/domain-live.xml" 2>/dev/null || true
	local booted=0 start=$SECONDS
	PRINTED=0
	while :; do
		if [[ $booted == 0 ]] && boot_state; then
			booted=1
			say "guest reached /init after $((SECONDS - start))s"
			start=$SECONDS
		fi
		[[ $booted == 0 ]] || print_progress
		if serial_results "$SERIAL" | grep -qx 'VMTEST DONE'; then
			GUEST_DONE=1
			break
		fi
		if ! domain_running; then
			break
		fi
		if [[ $booted == 0 ]] && ((SECONDS - start > BOOT_TIMEOUT)); then
			break
		fi
		if ((SECONDS - start > TIMEOUT)); then
			fail timeout "guest did not print VMTEST DONE within ${TIMEOUT}s"
			break
		fi
		sleep 1
	done
	[[ $booted == 1 ]] || boot_state && booted=1
	if [[ $booted == 0 ]]; then
		say "boot $attempt/$BOOT_ATTEMPTS never reached /init"
		show_tail "$SERIAL" "serial console"
		cp "$SERIAL" "$LOG_DIR/serial.failed-boot-$attempt.log"
		"${VIRSH[@]}" destroy "$DOMAIN" >/dev/null 2>&1 || true
		return 1
	fi
	print_progress
	say "guest ran its suite for $((SECONDS - start))s"
	if [[ $STOP == destroy ]] && domain_running; then
		"${VIRSH[@]}" destroy "$DOMAIN" >/dev/null 2>&1 || true
		STOPPED_BY="virsh destroy (--stop destroy)"
		return 0
	fi
	# The guest powers off after DONE (ACPI, on_poweroff destroy).
	local i
	for i in $(seq "$POWEROFF_TIMEOUT"); do
		domain_running || break
		sleep 1
	done
	if domain_running; then
		say "the domain is still running ${POWEROFF_TIMEOUT}s after the suite: virsh destroy"
		"${VIRSH[@]}" destroy "$DOMAIN" >/dev/null 2>&1 || true
		STOPPED_BY="virsh destroy"
	else
		STOPPED_BY="the guest's poweroff"
	fi
	return 0
}

check_daemon_gone() {
	local i left sock_left=""
	for i in $(seq 150); do
		left=$(daemon_pids | paste -sd' ')
		[[ -n $left ]] || break
		sleep 0.1
	done
	for i in $SOCKETS; do [[ -e $i ]] && sock_left+="/var/lib/libvirt${i#"$WORK/lib"} "; done
	if [[ -n $left ]]; then
		fail volfsd-exits-with-the-domain "volfsd process(es) $left still running 15 s after the domain ended ($STOPPED_BY)"
	elif [[ -n $sock_left ]]; then
		fail volfsd-exits-with-the-domain "socket(s) left: $sock_left"
	elif [[ -z $SOCKETS ]]; then
		pass volfsd-exits-with-the-domain
		info "domain ended by $STOPPED_BY; no volfsd process left (no socket of the domain was found while it ran)"
	else
		pass volfsd-exits-with-the-domain
		info "domain ended by $STOPPED_BY; no volfsd process left; socket ${SOCKETS//"$WORK/lib"//var/lib/libvirt} removed"
	fi
}

collect_logs() {
	local f
	f=$(find "$WORK/log/qemu" -maxdepth 1 -name "$DOMAIN.log" 2>/dev/null | head -n 1)
	[[ -z $f ]] || cp "$f" "$LOG_DIR/qemu-domain.log"
	f=$(find "$WORK/log/qemu" -maxdepth 1 -name "$DOMAIN-*virtiofsd.log" 2>/dev/null | head -n 1)
	[[ -z $f ]] || cp "$f" "$LOG_DIR/volfsd.log"
}

run_host_checks() {
	local checks="$HERE/suites/$SUITE.host.sh" line
	if [[ $GUEST_DONE == 0 ]]; then
		say "host-side checks ($SUITE.host.sh) skipped: the guest suite did not finish"
		return 0
	fi
	say "host-side checks ($SUITE.host.sh)"
	while IFS= read -r line; do
		case "$line" in
		"VMTEST PASS "* | "VMTEST FAIL "*) result_line "$line" ;;
		*) echo "  $line" ;;
		esac
	done < <(bash "$checks" "$SHARE" 2>&1 || echo "VMTEST FAIL host-checks: $SUITE.host.sh exited with status $?")
}

main() {
	parse_args "$@"
	[[ $EUID == 0 ]] || die "run as root (it installs packages and runs a system libvirtd)"
	local t_all=$SECONDS
	trap cleanup EXIT
	trap 'exit 130' INT TERM
	ensure_packages --no-install-recommends qemu-system-x86 libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients
	LIBVIRT_VERSION=$(libvirtd --version | awk '{print $NF}')
	say "libvirt $LIBVIRT_VERSION ($(dpkg-query -W -f='${Version}' libvirt-daemon)), $(qemu-system-x86_64 --version | head -n 1)"
	"$HERE/build-guest.sh" --quiet >/dev/null || die "build-guest.sh failed"
	mkdir -p "$LOG_DIR" || die "cannot create $LOG_DIR"
	LOG_DIR=$(readlink -f "$LOG_DIR")
	rm -f "$LOG_DIR"/*.log "$LOG_DIR"/*.xml "$LOG_DIR"/*.txt "$LOG_DIR"/libvirtd.out
	SERIAL="$LOG_DIR/serial.log"
	WORK=$(mktemp -d /tmp/volfs-libvirt.XXXXXX)
	chmod 0755 "$WORK"
	mkdir "$WORK/bin" "$WORK/share"
	BIN="$WORK/bin/volfsd"
	cp "$DAEMON" "$BIN"
	SHARE="$WORK/share"
	echo "hello from the host" >"$SHARE/hello-from-host.txt"
	if [[ $ROUTE == descriptor ]]; then
		install_descriptor
	else
		say "route binary-path: <binary path='$BIN'/> in the domain XML, no descriptor"
	fi
	start_libvirtd
	say "suite=$SUITE daemon=$DAEMON (run as $BIN) share=$SHARE logs=$LOG_DIR"
	local attempt rc=1 t0=$SECONDS
	STOPPED_BY=""
	for attempt in $(seq "$BOOT_ATTEMPTS"); do
		rc=0
		run_domain "$attempt" || rc=$?
		[[ $rc == 1 ]] || break
	done
	if [[ $rc == 0 ]]; then
		local line
		while IFS= read -r line; do
			case "$line" in "VMTEST PASS "* | "VMTEST FAIL "*) result_line "$line" ;; esac
		done < <(serial_results "$SERIAL")
		[[ $GUEST_DONE == 1 ]] || fail guest-done "the guest never printed VMTEST DONE"
		check_daemon
		check_daemon_gone
		collect_logs
		if [[ -s $LOG_DIR/volfsd.log ]]; then
			info "volfsd's last log line: $(tail -n 1 "$LOG_DIR/volfsd.log" | cut -c1-200)"
		fi
		run_host_checks
	elif [[ $rc == 1 ]]; then
		fail boot "the guest never reached /init in $BOOT_ATTEMPTS boots"
		collect_logs
	fi
	if ((FAILED > 0)); then
		show_tail "$LOG_DIR/volfsd.log" "volfsd's output (as libvirt captured it)"
		show_tail "$LOG_DIR/qemu-domain.log" "libvirt's QEMU log of the domain"
	fi
	say "the domain ran for $((SECONDS - t0))s; the whole script took $((SECONDS - t_all))s; logs in $LOG_DIR"
	echo "$PASSED passed, $FAILED failed"
	[[ $FAILED == 0 && $PASSED -gt 0 ]]
}

main "$@"
