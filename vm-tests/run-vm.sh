#!/usr/bin/env bash
# Boot the test guest against a vhost-user-fs daemon (volfsd, or virtiofsd for
# comparison) and run one guest suite over the virtio-fs share.
#
# Usage: vm-tests/run-vm.sh [options]
#   --vmm qemu|cloud-hypervisor  VMM to use (default qemu)
#   --daemon PATH          daemon binary (default target/release/volfsd)
#   --daemon-args "..."    extra daemon arguments (word-split)
#   --suite NAME           guest suite: runs /suites/NAME.sh (default basic);
#                          vm-tests/suites/NAME.host.sh, if present, runs on the
#                          host after the VM exits, given the shared dir
#   --also NAME[,NAME]     guest-only suites (no setup, hook or host script)
#                          run after --suite in the same boot, e.g. fioverify
#   --shared-dir DIR       directory to share (default: a fresh temp dir)
#   --queues N             virtio-fs request queues (default 1)
#   --smp N                guest CPUs (default: --queues)
#   --mem SIZE             guest memory, e.g. 1G (default 1G)
#   --timeout SECS         bound on the whole guest run (default 900)
#   --host-hook SCRIPT     host-side script run alongside the guest, given the
#                          shared dir (default vm-tests/host-hook.sh; "none": off)
#   --cache MODE           cache mode passed to the daemon (default: "never" if
#                          the daemon's --help mentions it, else "none")
#   --log-dir DIR          where logs go (default build/vm-logs/SUITE)
#   --prebuilt-guest       use build/guest as it is, do not run build-guest.sh
#                          (run-unprivileged.sh builds it as root first)
#   --boot-attempts N      boots that never reached /init are retried (default 3)
#   --allow-reboot         qemu: let the guest reboot (no -no-reboot); the suite
#                          then runs across several boots in one VM and one
#                          serial log (each boot prints VMTEST INIT; results of
#                          every boot count; VMTEST DONE must come after the
#                          last INIT). A boot after a reboot that never reaches
#                          /init, or more than MAX_BOOTS (5) boots, is a failure
#   --require              cloud-hypervisor: fail (instead of skipping, said as
#                          such) when it cannot run the guest: no binary, or
#                          no way to KVM (CI passes it)
#   --ch-version V         cloud-hypervisor to build when none is given: v53.0
#                          (default) or main (CH_VERSION; see ch-lib.sh)
#   --keep                 keep the temp dir (socket, default shared dir)
#
# Per-suite host scripts (all optional, next to suites/NAME.sh):
#   NAME.setup.sh SHARED_DIR   run once before the first boot; it may write
#                          extra daemon arguments, one per line, to
#                          $VMTEST_DAEMON_ARGS_FILE, and a path to
#                          $VMTEST_DAEMON_BIN_FILE to start the daemon from
#                          there instead (the upgrade suite: a copy it replaces),
#                          and extra QEMU arguments, one per line, to
#                          $VMTEST_VMM_ARGS_FILE (the workloads suite: its
#                          input disks; qemu only)
#   NAME.hook.sh SHARED_DIR SERIAL_LOG  run alongside the guest (besides
#                          --host-hook), e.g. to act on "VMTEST SYNC" lines
#   NAME.host.sh SHARED_DIR    host checks after the VM exited
# They get VMTEST_SHARE, VMTEST_WORK (the temp dir), VMTEST_LOG_DIR,
# VMTEST_SERIAL, VMTEST_DAEMON (binary), VMTEST_DAEMON_PID (the serving
# process), VMTEST_DAEMON_LAUNCHED_PID (the process started), VMTEST_ALLOW_REBOOT
# (1 with --allow-reboot, else 0) and VMTEST_DAEMON_IDS in the environment
# (LOG_DIR/daemon-ids.txt: the serving process's ids and its uid_map/gid_map,
# recorded when the guest reaches /init; host scripts map guest ids through it).
# Mounts left under the temp dir are lazily unmounted before it is removed.
#
# cloud-hypervisor (ch-lib.sh): the binary is CH_BIN, else cloud-hypervisor on
# PATH, else built by ../shared/cloud-hypervisor/build.sh next to the repository.
# With hardware KVM it runs here; without, this script boots an L1 guest under
# QEMU TCG (-cpu max: nested SVM, kvm-amd) whose root is this machine's root
# read-only, and runs itself in L1 with the same options: the daemon, the hooks
# and cloud-hypervisor run in L1, and the test guest (L2) boots from the same
# bzImage and initramfs. The log says which. L1's console and the inner run's
# output are in LOG_DIR/l1/.
#
# The guest prints "VMTEST PASS name", "VMTEST FAIL name: why", "VMTEST INFO ..."
# and finally "VMTEST DONE" on its serial console. This script prints each
# result, adds its own checks (the daemon must exit 0 once the VM is gone),
# and ends with "N passed, N failed". Exit status: 0 only if nothing failed
# and the guest printed DONE.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=runner-lib.sh
. "$HERE/runner-lib.sh"
# shellcheck source=ch-lib.sh
. "$HERE/ch-lib.sh"

VMM=qemu
DAEMON="$REPO/target/release/volfsd"
DAEMON_ARGS=""
SUITE=basic
ALSO=""
SHARE=""
QUEUES=1
SMP=""
MEM=1G
TIMEOUT=900
HOOK="$HERE/host-hook.sh"
CACHE=""
LOG_DIR=""
BOOT_ATTEMPTS=3
BOOT_TIMEOUT=180 # seconds from VMM start to the init marker (TCG is slow)
DAEMON_EXIT_TIMEOUT=20
REQUIRE=0
KEEP=0
ALLOW_REBOOT=0
PREBUILT_GUEST=0
MAX_BOOTS=5 # with --allow-reboot: boots of one VM before it is stopped

# Processes and temp dir owned by this script; cleaned up on any exit.
WORK=""
DAEMON_PID=""
VMM_PID=""
HOOK_PID=""
SUITE_HOOK_PID=""
SUITE_DAEMON_ARGS=() # from suites/NAME.setup.sh
SUITE_VMM_ARGS=()    # from suites/NAME.setup.sh (qemu only)

PASSED=0
FAILED=0
GUEST_DONE=0

say() { echo "run-vm: $*"; }
die() {
	echo "run-vm: error: $*" >&2
	exit 2
}

usage() {
	sed -n '2,/^set -/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
	exit "${1:-0}"
}

parse_args() {
	while [[ $# -gt 0 ]]; do
		case "$1" in
		--vmm) VMM=${2:?}; shift ;;
		--daemon) DAEMON=${2:?}; shift ;;
		--daemon-args) DAEMON_ARGS=${2?}; shift ;;
		--suite) SUITE=${2:?}; shift ;;
		--also) ALSO=${2:?}; shift ;;
		--shared-dir) SHARE=${2:?}; shift ;;
		--queues) QUEUES=${2:?}; shift ;;
		--smp) SMP=${2:?}; shift ;;
		--mem) MEM=${2:?}; shift ;;
		--timeout) TIMEOUT=${2:?}; shift ;;
		--host-hook) HOOK=${2:?}; shift ;;
		--cache) CACHE=${2:?}; shift ;;
		--log-dir) LOG_DIR=${2:?}; shift ;;
		--boot-attempts) BOOT_ATTEMPTS=${2:?}; shift ;;
		--require) REQUIRE=1 ;;
		--ch-version) CH_VERSION=${2:?}; shift ;;
		--keep) KEEP=1 ;;
		--allow-reboot) ALLOW_REBOOT=1 ;;
		--prebuilt-guest) PREBUILT_GUEST=1 ;;
		-h | --help) usage 0 ;;
		*) echo "run-vm: unknown option: $1" >&2; usage 2 ;;
		esac
		shift
	done
	case "$VMM" in qemu | cloud-hypervisor) ;; *) die "--vmm must be qemu or cloud-hypervisor" ;; esac
	[[ $ALLOW_REBOOT == 0 || $VMM == qemu ]] || die "--allow-reboot is for --vmm qemu only"
	[[ $QUEUES =~ ^[1-9][0-9]*$ ]] || die "--queues must be a positive number"
	SMP=${SMP:-$QUEUES}
	[[ $SMP =~ ^[1-9][0-9]*$ ]] || die "--smp must be a positive number"
	[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a number of seconds"
	[[ -x $DAEMON ]] || die "daemon '$DAEMON' is not an executable (build volfsd with 'cargo build --release' or pass --daemon)"
	DAEMON=$(readlink -f "$DAEMON")
	[[ -f $HERE/suites/$SUITE.sh ]] || die "no guest suite vm-tests/suites/$SUITE.sh"
	local a
	for a in ${ALSO//,/ }; do
		[[ -f $HERE/suites/$a.sh ]] || die "--also: no guest suite vm-tests/suites/$a.sh"
		[[ ! -e $HERE/suites/$a.setup.sh && ! -e $HERE/suites/$a.hook.sh && ! -e $HERE/suites/$a.host.sh ]] ||
			die "--also $a: that suite has host scripts; run it with --suite"
	done
	if [[ $HOOK != none ]]; then
		[[ -x $HOOK ]] || die "host hook '$HOOK' is not executable"
		HOOK=$(readlink -f "$HOOK")
	fi
	LOG_DIR=$(realpath -m "${LOG_DIR:-$REPO/build/vm-logs/$SUITE}")
}

# ---------------------------------------------------------------- cleanup


# Mounts a suite left under the temp dir (e.g. bind mounts made through the
# control socket), deepest first, so rm -rf never reaches into a bind source.
unmount_under() { # unmount_under DIR
	local dir=$1 m
	[[ -n $dir && -d $dir ]] || return 0
	awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo |
		sort -r | while read -r m; do
		say "unmounting leftover mount $m"
		umount -l "$m" 2>/dev/null || true
	done
}

cleanup() {
	l1_stop
	stop_pid "$VMM_PID"
	stop_pid "$HOOK_PID"
	stop_pid "$SUITE_HOOK_PID"
	stop_pid "$DAEMON_PID"
	unmount_under "$WORK"
	if [[ -n $WORK && $KEEP == 0 ]]; then
		rm -rf "$WORK"
	elif [[ -n $WORK ]]; then
		say "kept $WORK"
	fi
}

# ---------------------------------------------------------------- results



# Complete VMTEST lines of the serial log, without the tty's carriage returns.

PRINTED=0
# Print the result lines that arrived since the last call (live progress);
# the counts are only taken from the final full pass over the log.
print_progress() {
	local log=$1 lines
	lines=$(serial_results "$log" | wc -l)
	if ((lines > PRINTED)); then
		serial_results "$log" | sed -n "$((PRINTED + 1)),${lines}p" |
			grep -v -e '^VMTEST INIT$' -e '^VMTEST DONE$' | sed 's/^/  /' || true
		PRINTED=$lines
	fi
}


# ---------------------------------------------------------------- host setup


# Hardware virtualization: /dev/kvm alone is not enough here (a software
# hypervisor can provide it without being able to boot a stock kernel).
cpu_has_hw_virt() { grep -qwE 'vmx|svm' /proc/cpuinfo; }

qemu_kvm_works() {
	[[ -r /dev/kvm && -w /dev/kvm ]] && cpu_has_hw_virt || return 1
	echo quit | timeout 20 qemu-system-x86_64 -accel kvm -machine none -nodefaults \
		-display none -monitor stdio >/dev/null 2>&1
}

mem_mib() { # 1G / 1024M / 1024 -> MiB
	local m=${1^^}
	case "$m" in
	*G) echo $((${m%G} * 1024)) ;;
	*M) echo "${m%M}" ;;
	*[0-9]) echo "$m" ;;
	*) die "bad --mem '$1' (use e.g. 1G or 1024M)" ;;
	esac
}

# The daemon gets virtiofsd-compatible flags; only the name of the
# "no caching" mode differs (virtiofsd: never, volfsd: none, with never as an
# alias). Use "none" if the daemon's help for --cache lists it.
daemon_cache_mode() {
	[[ -n $CACHE ]] && { echo "$CACHE"; return; }
	if "$DAEMON" --help 2>&1 | awk '/^ *--cache/ {f = 1; next} /^ *--[a-z]/ {f = 0} f' | grep -qw none; then
		echo none
	else
		echo never
	fi
}

serving_pid() { # serving_pid PID: its only child if it has exactly one, else PID
	local kids
	kids=$(cat "/proc/$1/task/$1/children" 2>/dev/null || true)
	if [[ $(wc -w <<<"$kids") == 1 ]]; then echo $kids; else echo "$1"; fi
}

start_daemon() { # start_daemon SOCKET LOG
	local sock=$1 log=$2 i
	rm -f "$sock"
	# shellcheck disable=SC2086 # --daemon-args is deliberately word-split
	"$DAEMON" --socket-path="$sock" --shared-dir="$SHARE" --cache="$(daemon_cache_mode)" \
		$DAEMON_ARGS "${SUITE_DAEMON_ARGS[@]}" >"$log" 2>&1 &
	DAEMON_PID=$!
	export VMTEST_DAEMON_PID=$DAEMON_PID VMTEST_DAEMON_LAUNCHED_PID=$DAEMON_PID
	# (300: a nested run in L1 under TCG may take seconds to start it)
	for i in $(seq 300); do
		if [[ -S $sock ]]; then
			# Hooks look at the serving process: in volfsd's namespace sandbox
			# the launched process is a supervisor and its one child serves.
			VMTEST_DAEMON_PID=$(serving_pid "$DAEMON_PID")
			return 0
		fi
		kill -0 "$DAEMON_PID" 2>/dev/null || break
		sleep 0.1
	done
	show_tail "$log" "daemon log"
	die "daemon did not create its socket $sock"
}

# The daemon's processes and id maps, for host scripts (VMTEST_DAEMON_IDS) and
# run-unprivileged.sh: "launched PID", "serving PID", the serving process's
# Uid/Gid/NSpid lines as the host sees them, and "uid_map IN OUT COUNT" /
# "gid_map ..." lines. Taken once the guest reached /init: by then the daemon
# has long entered its sandbox (user namespace and id maps included).
record_daemon_ids() { # record_daemon_ids FILE
	local f=$1 spid
	[[ -n $DAEMON_PID ]] && kill -0 "$DAEMON_PID" 2>/dev/null || return 0
	spid=$(serving_pid "$DAEMON_PID")
	{
		echo "launched $DAEMON_PID"
		echo "serving $spid"
		grep -E '^(Uid|Gid|NSpid):' "/proc/$spid/status" 2>/dev/null || true
		awk '{print "uid_map", $1, $2, $3}' "/proc/$spid/uid_map" 2>/dev/null || true
		awk '{print "gid_map", $1, $2, $3}' "/proc/$spid/gid_map" 2>/dev/null || true
	} >"$f"
}

start_hook() { # start_hook LOG SERIAL_LOG
	local suite_hook="$HERE/suites/$SUITE.hook.sh"
	if [[ -f $suite_hook ]]; then
		VMTEST_SERIAL=$2 bash "$suite_hook" "$SHARE" "$2" >>"$LOG_DIR/suite-hook.log" 2>&1 &
		SUITE_HOOK_PID=$!
	fi
	[[ $HOOK == none ]] && return 0
	"$HOOK" "$SHARE" >>"$1" 2>&1 &
	HOOK_PID=$!
}

# suites/NAME.setup.sh, once before the first boot.
run_suite_setup() {
	local setup="$HERE/suites/$SUITE.setup.sh" line
	[[ -f $setup ]] || return 0
	export VMTEST_DAEMON_ARGS_FILE="$WORK/suite-daemon-args" VMTEST_DAEMON_BIN_FILE="$WORK/suite-daemon-bin"
	export VMTEST_VMM_ARGS_FILE="$WORK/suite-vmm-args"
	: >"$VMTEST_DAEMON_ARGS_FILE"
	: >"$VMTEST_VMM_ARGS_FILE"
	bash "$setup" "$SHARE" >"$LOG_DIR/setup.log" 2>&1 || {
		show_tail "$LOG_DIR/setup.log" "suite setup log"
		die "$SUITE.setup.sh failed"
	}
	while IFS= read -r line; do
		[[ -n $line ]] && SUITE_DAEMON_ARGS+=("$line")
	done <"$VMTEST_DAEMON_ARGS_FILE"
	while IFS= read -r line; do
		[[ -n $line ]] && SUITE_VMM_ARGS+=("$line")
	done <"$VMTEST_VMM_ARGS_FILE"
	[[ ${#SUITE_VMM_ARGS[@]} == 0 || $VMM == qemu ]] || die "$SUITE.setup.sh gave QEMU arguments: the suite runs under --vmm qemu only"
	if [[ -s $VMTEST_DAEMON_BIN_FILE ]]; then
		DAEMON=$(cat "$VMTEST_DAEMON_BIN_FILE")
		[[ -x $DAEMON ]] || die "$SUITE.setup.sh named the daemon binary '$DAEMON', which is not an executable"
		export VMTEST_DAEMON=$DAEMON
	fi
	say "suite setup done; extra daemon args: ${SUITE_DAEMON_ARGS[*]:-none}; extra QEMU args: ${SUITE_VMM_ARGS[*]:-none}"
}

# After the VMM is gone the daemon must notice the disconnect and exit 0.
check_daemon_exit() {
	local i status=0
	for i in $(seq $((DAEMON_EXIT_TIMEOUT * 10))); do
		kill -0 "$DAEMON_PID" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$DAEMON_PID" 2>/dev/null; then
		fail daemon-exit "daemon still running ${DAEMON_EXIT_TIMEOUT}s after the VMM disconnected"
		stop_pid "$DAEMON_PID"
	else
		wait "$DAEMON_PID" || status=$?
		if [[ $status == 0 ]]; then
			pass daemon-exit
		else
			fail daemon-exit "daemon exited with status $status after the VMM disconnected"
		fi
	fi
	DAEMON_PID=""
}

# ---------------------------------------------------------------- VMMs

KERNEL="$REPO/build/guest/vmlinuz"
INITRD="$REPO/build/guest/initramfs.cpio.gz"

ATTEMPT=1
# VMTEST_BREAK_BOOTS=N (for testing this script): the first N boots get an
# init that exits at once, so they never print the marker and get retried.
cmdline() {
	local extra=""
	((ATTEMPT > ${VMTEST_BREAK_BOOTS:-0})) || extra=" rdinit=/bin/false"
	# VMTEST_BACKEND (set by run-backend.sh, run-pair.sh): what the share sits on,
	# for the guest's backend_lacks (lib.sh).
	[[ -z ${VMTEST_BACKEND:-} ]] || extra+=" vmtest.backend=$VMTEST_BACKEND"
	# NFILES: the basic suite's many-files count (basic.sh and basic.host.sh).
	[[ -z ${NFILES:-} ]] || extra+=" vmtest.nfiles=$NFILES"
	# Guest-side sizes of the suites (basic.sh, fioverify.sh), from the environment.
	local v
	for v in BIG_MIB PAR_MIB FIOVERIFY_SIZE FIOVERIFY_BS; do
		[[ -z ${!v:-} ]] || extra+=" vmtest.env.$v=${!v}"
	done
	[[ -z $ALSO ]] || extra+=" vmtest.also=$ALSO"
	echo "console=ttyS0 panic=-1 quiet vmtest.suite=$SUITE$extra"
}

start_qemu() { # start_qemu SOCKET SERIAL_LOG VMM_LOG
	local sock=$1 serial=$2 log=$3 accel cpu mem
	mem=$(mem_mib "$MEM")
	if qemu_kvm_works; then
		accel=kvm cpu=host
	else
		accel=tcg,thread=multi cpu=max
	fi
	local reboot=(-no-reboot)
	[[ $ALLOW_REBOOT == 0 ]] || reboot=()
	echo "qemu: accel=$accel smp=$SMP mem=${mem}M queues=$QUEUES" >"$log"
	# vhost-user needs guest RAM in a shareable memfd the daemon can map.
	qemu-system-x86_64 \
		-machine q35 -accel "$accel" -cpu "$cpu" -smp "$SMP" -m "${mem}M" \
		-object "memory-backend-memfd,id=mem,size=${mem}M,share=on" -numa node,memdev=mem \
		-chardev "socket,id=char0,path=$sock" \
		-device "vhost-user-fs-pci,chardev=char0,tag=share,num-request-queues=$QUEUES,queue-size=1024" \
		-kernel "$KERNEL" -initrd "$INITRD" -append "$(cmdline)" \
		-nodefaults -display none -monitor none -serial "file:$serial" \
		-nic none "${reboot[@]}" "${SUITE_VMM_ARGS[@]}" >>"$log" 2>&1 &
	VMM_PID=$!
	echo "$VMM_PID" >"$WORK/vmm.pid" # for hooks that stop the VM (pair-a.hook.sh)
	say "booting: qemu accel=$accel, $SMP cpu(s), ${mem}M, $QUEUES request queue(s)$([[ $ALLOW_REBOOT == 0 ]] || echo ', guest may reboot')"
}

start_cloud_hypervisor() { # start_cloud_hypervisor SOCKET SERIAL_LOG VMM_LOG
	local sock=$1 serial=$2 log=$3
	# The same bzImage as QEMU's; an API socket for hooks that drive it
	# (ch-remote). The serial console is cloud-hypervisor's standard output,
	# appended to the serial log: a file given to --serial would be truncated by
	# a guest reset, losing what the guest printed before it.
	echo "cloud-hypervisor: $CH_VERSION_TEXT ($CH_BIN); smp=$SMP mem=$MEM queues=$QUEUES" >"$log"
	"$CH_BIN" -v --log-file "$log" \
		--kernel "$KERNEL" --initramfs "$INITRD" --cmdline "$(cmdline)" \
		--cpus "boot=$SMP" --memory "size=$MEM,shared=on" \
		--fs "tag=share,socket=$sock,num_queues=$QUEUES,queue_size=1024" \
		--api-socket "path=$WORK/ch-api.sock" \
		--serial tty --console off </dev/null >>"$serial" 2>>"$log" &
	VMM_PID=$!
	echo "$VMM_PID" >"$WORK/vmm.pid"
	say "booting: cloud-hypervisor ($CH_VERSION_TEXT), $SMP cpu(s), $MEM, $QUEUES request queue(s)"
}

# cloud-hypervisor resets the VM when the guest triple-faults or reboots (it has
# no -no-reboot): that ends the run, named from its log.
ch_guest_reset() { # ch_guest_reset VMM_LOG: prints why, or fails
	[[ $VMM == cloud-hypervisor ]] || return 1
	grep -aE 'triple-fault|VM reset event' "$1" 2>/dev/null | head -n 2 | sed 's/^.*-- //' | tr '\n' ' ' | grep .
}

# Lines of the serial log matching an extended regex (boot and reboot markers).
serial_count() { # serial_count SERIAL_LOG REGEX
	tr -d '\r' <"$1" 2>/dev/null | grep -acE "$2" || true
}

# Watch one VM run. Returns 0 when the VM has exited after reaching /init,
# 1 when it never reached /init (worth a retry), 2 on timeout, 3 when the
# daemon died under the running guest. With --allow-reboot the guest may boot
# several times in this VM (every boot prints VMTEST INIT; `reboot -f` prints
# "reboot: Restarting system"): 4 when a boot after a reboot never reached
# /init, 5 when the guest booted more than MAX_BOOTS times.
watch_vm() { # watch_vm SERIAL_LOG
	local serial=$1 start=$SECONDS booted=0 inits restarts seen_restarts=0 reboot_at=0
	PRINTED=0
	GUEST_BOOTS=0
	while kill -0 "$VMM_PID" 2>/dev/null; do
		inits=$(serial_count "$serial" '^VMTEST INIT')
		if ((inits > GUEST_BOOTS)); then
			GUEST_BOOTS=$inits
			if [[ $booted == 0 ]]; then
				booted=1
				record_daemon_ids "$VMTEST_DAEMON_IDS"
				say "guest reached /init after $((SECONDS - start))s"
				start=$SECONDS
			else
				say "guest reached /init again (boot $GUEST_BOOTS) $((SECONDS - reboot_at))s after its reboot"
			fi
		fi
		[[ $booted == 1 ]] && print_progress "$serial"
		if [[ $booted == 0 ]] && ((SECONDS - start > BOOT_TIMEOUT)); then
			stop_pid "$VMM_PID"
			return 1
		fi
		if [[ $ALLOW_REBOOT == 1 && $booted == 1 ]]; then
			restarts=$(serial_count "$serial" 'reboot: Restarting system')
			if ((restarts > seen_restarts)); then
				seen_restarts=$restarts
				reboot_at=$SECONDS
				say "guest rebooted (reboot $restarts)"
			fi
			# A reboot whose next boot has not reached /init yet.
			if ((restarts >= GUEST_BOOTS && SECONDS - reboot_at > BOOT_TIMEOUT)); then
				stop_pid "$VMM_PID"
				print_progress "$serial"
				return 4
			fi
			if ((GUEST_BOOTS > MAX_BOOTS)); then
				stop_pid "$VMM_PID"
				print_progress "$serial"
				return 5
			fi
		fi
		if ((SECONDS - start > TIMEOUT)); then
			stop_pid "$VMM_PID"
			print_progress "$serial"
			return 2
		fi
		if RESET_WHY=$(ch_guest_reset "$VMM_LOG_FILE"); then
			stop_pid "$VMM_PID"
			print_progress "$serial"
			[[ $booted == 1 ]] || return 1
			return 6
		fi
		# A daemon that dies under a running guest leaves it hanging on
		# FUSE requests forever: stop early instead of waiting for TIMEOUT.
		# VMTEST_DAEMON_MAY_EXIT=1 (run-crash-compare.sh's virtiofsd side): the
		# death is what is being observed; the suite hook ends the VM.
		if [[ ${VMTEST_DAEMON_MAY_EXIT:-0} == 1 && $booted == 1 ]] && ! kill -0 "$DAEMON_PID" 2>/dev/null; then
			[[ ${DAEMON_EXIT_SEEN:-0} == 1 ]] || say "daemon exited under the running guest (VMTEST_DAEMON_MAY_EXIT=1: watching on)"
			DAEMON_EXIT_SEEN=1
		elif ! kill -0 "$DAEMON_PID" 2>/dev/null; then
			sleep 3
			if kill -0 "$VMM_PID" 2>/dev/null; then
				stop_pid "$VMM_PID"
				print_progress "$serial"
				[[ $booted == 1 ]] || return 1
				return 3
			fi
		fi
		sleep 1
	done
	wait "$VMM_PID" || true
	VMM_PID=""
	grep -aq '^VMTEST INIT' "$serial" 2>/dev/null || return 1
	GUEST_BOOTS=$(serial_count "$serial" '^VMTEST INIT')
	print_progress "$serial"
	GUEST_SECONDS=$((SECONDS - start))
	return 0
}

# Boot the guest until it reaches /init (at most BOOT_ATTEMPTS times), run
# the suite, and collect its results. A suite that ran is never retried.
run_guest() {
	local start_vmm=$1 attempt serial daemon_log vmm_log sock="$WORK/vhost-fs.sock" rc
	for attempt in $(seq "$BOOT_ATTEMPTS"); do
		ATTEMPT=$attempt
		serial="$LOG_DIR/serial.log" daemon_log="$LOG_DIR/daemon.log" vmm_log="$LOG_DIR/vmm.log"
		: >"$serial"
		start_daemon "$sock" "$daemon_log"
		export VMTEST_SERIAL=$serial
		start_hook "$LOG_DIR/hook.log" "$serial"
		VMM_LOG_FILE=$vmm_log
		"$start_vmm" "$sock" "$serial" "$vmm_log"
		rc=0
		watch_vm "$serial" || rc=$?
		stop_pid "$HOOK_PID"
		HOOK_PID=""
		stop_pid "$SUITE_HOOK_PID"
		SUITE_HOOK_PID=""
		if [[ $rc == 1 ]]; then
			say "boot attempt $attempt/$BOOT_ATTEMPTS never reached /init"
			show_tail "$serial" "serial console"
			show_tail "$vmm_log" "VMM log"
			cp "$serial" "$LOG_DIR/serial.failed-boot-$attempt.log"
			stop_pid "$DAEMON_PID"
			DAEMON_PID=""
			continue
		fi
		local line
		while IFS= read -r line; do
			case "$line" in "VMTEST PASS "* | "VMTEST FAIL "*) result_line "$line" >/dev/null ;; esac
		done < <(serial_results "$serial")
		if [[ $rc == 3 ]]; then
			local status=0
			wait "$DAEMON_PID" || status=$?
			DAEMON_PID=""
			fail daemon-alive "daemon exited (status $status) while the guest was still running"
		elif [[ $rc == 2 ]]; then
			fail timeout "guest did not finish within ${TIMEOUT}s"
		elif [[ $rc == 4 ]]; then
			fail reboot-boot "boot $((GUEST_BOOTS + 1)) (after a guest reboot) never reached /init within ${BOOT_TIMEOUT}s"
		elif [[ $rc == 5 ]]; then
			fail reboot-loop "the guest booted $GUEST_BOOTS times (more than $MAX_BOOTS): stopped"
		elif [[ $rc == 6 ]]; then
			fail guest-reset "cloud-hypervisor reset the VM while the suite ran: $RESET_WHY"
		else
			say "guest finished in ${GUEST_SECONDS}s (from /init to power-off)"
		fi
		[[ $ALLOW_REBOOT == 0 ]] || say "guest booted $GUEST_BOOTS time(s) in this VM"
		# DONE is the very last marker: after the last boot's INIT.
		if serial_results "$serial" | grep -E '^VMTEST (INIT|DONE)$' | tail -n 1 | grep -qx 'VMTEST DONE'; then
			GUEST_DONE=1
		else
			fail guest-done "guest never printed VMTEST DONE (after its last VMTEST INIT)"
			show_tail "$serial" "serial console"
		fi
		[[ -z $DAEMON_PID ]] || check_daemon_exit
		[[ $FAILED == 0 ]] || {
			show_tail "$daemon_log" "daemon log"
			show_tail "$LOG_DIR/hook.log" "host hook log"
			show_tail "$LOG_DIR/suite-hook.log" "suite hook log"
		}
		return 0
	done
	fail boot "guest never reached /init in $BOOT_ATTEMPTS boot attempts"
}

run_host_checks() {
	local checks="$HERE/suites/$SUITE.host.sh" line
	[[ -f $checks ]] || return 0
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

# No hardware KVM: the same run inside an L1 guest (ch-lib.sh), this script
# run again there with the same options. Its output is streamed here; the last
# line is its count, plus a failure of L1 itself if it did not run it.
run_nested() {
	local l2 l1mem smp daemon
	l2=$(mem_mib "$MEM")
	l1mem=$((l2 + 1536))
	((l1mem >= 2560)) || l1mem=2560
	smp=$L1_SMP
	[[ -z $SHARE ]] || die "--shared-dir: in L1 the host's files are read-only; the share is made in L1"
	daemon=$(l1_visible "$DAEMON" "$LOG_DIR")
	ch_nested_exec "$LOG_DIR" "$l1mem" "$smp" $((TIMEOUT + 600)) \
		"$HERE/run-vm.sh" "${ORIG_ARGS[@]}" --daemon "$daemon" --log-dir "$LOG_DIR" --prebuilt-guest
}

finish() {
	echo "$PASSED passed, $FAILED failed"
	[[ $FAILED == 0 ]]
}

main() {
	ORIG_ARGS=("$@")
	parse_args "$@"
	trap cleanup EXIT
	trap 'exit 130' INT TERM
	CH_MODE=""
	[[ $VMM != cloud-hypervisor ]] || ch_setup "$REQUIRE"
	ensure_packages qemu-system-x86
	if [[ $PREBUILT_GUEST == 0 ]]; then
		"$HERE/build-guest.sh" --quiet >/dev/null
	else
		[[ -r $KERNEL && -r $INITRD ]] || die "--prebuilt-guest: no readable $KERNEL and $INITRD (run vm-tests/build-guest.sh)"
	fi
	mkdir -p "$LOG_DIR" 2>/dev/null && [[ -w $LOG_DIR ]] ||
		die "cannot write the log dir $LOG_DIR (as $(id -un); pass --log-dir)"
	if [[ $CH_MODE == nested ]]; then
		local t0=$SECONDS
		run_nested
		say "suite $SUITE took $((SECONDS - t0))s in total (nested, L1 boot included)"
		finish
		return
	fi
	rm -f "$LOG_DIR"/*.log "$LOG_DIR/daemon-ids.txt"
	export VMTEST_DAEMON_IDS="$LOG_DIR/daemon-ids.txt"
	WORK=$(mktemp -d /tmp/volfs-vmtest.XXXXXX)
	if [[ -z $SHARE ]]; then
		SHARE="$WORK/share"
		mkdir "$SHARE"
		# SharedDir on a shared mount, as a platform provides it: a volume
		# bind-mounted under it while the daemon runs propagates into the
		# daemon's own mount namespace (its default sandbox). Root only; the
		# cleanup unmounts it with everything under $WORK.
		if [[ $EUID == 0 ]]; then
			mount --bind "$SHARE" "$SHARE" && mount --make-shared "$SHARE"
		fi
	fi
	[[ -d $SHARE ]] || die "shared dir '$SHARE' does not exist"
	SHARE=$(readlink -f "$SHARE")
	export VMTEST_SHARE=$SHARE VMTEST_WORK=$WORK VMTEST_LOG_DIR=$LOG_DIR VMTEST_DAEMON=$DAEMON VMTEST_ALLOW_REBOOT=$ALLOW_REBOOT
	run_suite_setup
	say "suite=$SUITE vmm=$VMM daemon=$DAEMON cache=$(daemon_cache_mode) share=$SHARE logs=$LOG_DIR"
	local t0=$SECONDS
	if [[ $VMM == qemu ]]; then
		run_guest start_qemu
	else
		run_guest start_cloud_hypervisor
	fi
	run_host_checks
	say "suite $SUITE took $((SECONDS - t0))s in total"
	finish
}

main "$@"
