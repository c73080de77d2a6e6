# cloud-hypervisor for the VM suites: which binary, where it runs, and the L1
# guest that gives it KVM on a host without hardware virtualization.
# Sourced by run-vm.sh, run-ch.sh and run-ch-migration.sh after runner-lib.sh
# (the runner defines say and die, REPO and HERE).
#
# The binary (ch_find): CH_BIN; else `cloud-hypervisor` on PATH; else built by
# build.sh of cloud-hypervisor's source next to the repository
# (REPO/../shared/cloud-hypervisor/build.sh, or CH_SOURCE_DIR/build.sh), once per
# machine into its cache (/var/cache/cloud-hypervisor). CH_VERSION picks what
# build.sh builds: v53.0 (default) or main (its main branch, main-ae44c29).
# ch-remote: CH_REMOTE, else next to the binary, else on PATH.
#
# Where it runs (ch_mode): "direct" where /dev/kvm is usable and the CPU has
# VT-x or AMD-V (vmx/svm in /proc/cpuinfo: a software /dev/kvm without them
# cannot boot a stock kernel); else "nested": an L1 guest under QEMU TCG with
# -cpu max (QEMU emulates AMD SVM with nested paging, so the same Debian kernel
# loads kvm-amd), whose root is the host's own root file system read-only (9p),
# runs the same runner with the daemon and cloud-hypervisor, and cloud-hypervisor
# boots the test guest (L2) from the same bzImage and initramfs. VMTEST_CH_MODE
# (direct|nested) forces one. Inside L1 (VMTEST_IN_L1=1) only "direct" is right.

CH_VERSION=${CH_VERSION:-v53.0}
L1_BOOT_TIMEOUT=${L1_BOOT_TIMEOUT:-180} # seconds from QEMU's start to L1's stage 2
L1_BOOT_ATTEMPTS=${L1_BOOT_ATTEMPTS:-3}
L1_DIR="$REPO/build/l1"
L1_QPID=""
# L1's kernel command line: no transparent huge pages (a huge page collapsed or
# split under a running L2 changes L1's mappings behind L2's nested page tables;
# see vm-tests/README.md, the guest resets), no NUMA balancing (the same: it
# unmaps pages to sample them).
L1_CMDLINE=${L1_CMDLINE:-transparent_hugepage=never numa_balancing=disable}
L1_ACCEL=${L1_ACCEL:-tcg,thread=multi}
# One vCPU: with two, L2 guests triple-faulted and L1's kernel found its memory
# corrupted (a vCPU thread's stack end overwritten) in about half of the runs
# here, under a busy host; with one, none did (vm-tests/README.md).
L1_SMP=${L1_SMP:-1}

ch_version_name() { # the build.sh name of a version: v53.0 or main-ae44c29
	case $1 in
	v53 | v53.0 | 53.0) echo v53.0 ;;
	main | main-ae44c29) echo main-ae44c29 ;;
	*) echo "$1" ;;
	esac
}

# The directory of cloud-hypervisor's source archives and build.sh, if any.
ch_source_dir() {
	local d
	for d in ${CH_SOURCE_DIR:+"$CH_SOURCE_DIR"} "$REPO/../shared/cloud-hypervisor" \
		"$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null)/../../shared/cloud-hypervisor"; do
		[[ -f $d/build.sh ]] && { (cd "$d" && pwd); return 0; }
	done
	return 1
}

# ch_find: sets CH_BIN, CH_REMOTE (may be empty), CH_FROM (how it was found) and
# CH_VERSION_TEXT; 1 with CH_MISSING (why, naming the three ways) when none.
ch_find() {
	local src dir log v
	CH_FROM="" CH_MISSING="" CH_VERSION_TEXT=""
	v=$(ch_version_name "$CH_VERSION")
	if [[ -n ${CH_BIN:-} ]]; then
		[[ -x $CH_BIN ]] || { CH_MISSING="CH_BIN=$CH_BIN is not an executable"; return 1; }
		CH_FROM="CH_BIN"
	elif command -v cloud-hypervisor >/dev/null; then
		CH_BIN=$(command -v cloud-hypervisor)
		CH_FROM="PATH"
	elif src=$(ch_source_dir); then
		mkdir -p "$REPO/build"
		log="$REPO/build/ch-build-$v.log"
		[[ -f /var/cache/cloud-hypervisor/$v/.done ]] ||
			say "cloud-hypervisor $v: building it from $src (once per machine, about 4 minutes; log $log)"
		if dir=$(bash "$src/build.sh" "$v" 2>"$log" | tail -n 1) && [[ -x $dir/bin/cloud-hypervisor ]]; then
			CH_BIN=$dir/bin/cloud-hypervisor
			CH_FROM="built by $src/build.sh $v, cached in $dir"
		else
			CH_MISSING="$src/build.sh $v failed: $(tail -n 3 "$log" | tr '\n' ' ')"
			return 1
		fi
	else
		CH_MISSING="no cloud-hypervisor: set CH_BIN=/path/to/cloud-hypervisor, or put cloud-hypervisor on PATH, or give the repository its source: ../shared/cloud-hypervisor/build.sh next to it (looked in $REPO/../shared/cloud-hypervisor; CH_SOURCE_DIR overrides)"
		return 1
	fi
	CH_BIN=$(readlink -f "$CH_BIN")
	if [[ -z ${CH_REMOTE:-} ]]; then
		CH_REMOTE=$(dirname "$CH_BIN")/ch-remote
		[[ -x $CH_REMOTE ]] || CH_REMOTE=$(command -v ch-remote || true)
	fi
	CH_VERSION_TEXT=$("$CH_BIN" --version 2>&1 | head -n 1)
	export CH_BIN CH_REMOTE
}

# ch_setup REQUIRE: finds the binary and where it runs (CH_MODE: direct or
# nested), saying so. Without either: says the suite is not run and exits 0, or,
# with REQUIRE=1 (CI), fails naming why and exits 1. Uses the runner's fail and
# PASSED/FAILED.
ch_setup() {
	local why=""
	if ! ch_find; then
		why=$CH_MISSING
	elif ! CH_MODE=$(ch_mode); then
		why="cloud-hypervisor cannot run a guest here: $CH_MODE_WHY"
	fi
	if [[ -n $why ]]; then
		say "cloud-hypervisor not available: guest suite not run: $why"
		if [[ $1 == 1 ]]; then
			fail cloud-hypervisor "$why"
			echo "$PASSED passed, $FAILED failed"
			exit 1
		fi
		exit 0
	fi
	say "cloud-hypervisor: $CH_BIN ($CH_VERSION_TEXT; $CH_FROM); ch-remote: ${CH_REMOTE:-none}"
	case $CH_MODE in
	direct) say "cloud-hypervisor runs here: $([[ ${VMTEST_IN_L1:-0} == 1 ]] && echo "in L1, on its nested kvm-amd" || echo "hardware KVM")" ;;
	nested) say "no hardware KVM here: cloud-hypervisor runs nested, in an L1 guest under QEMU TCG (-cpu max: AMD SVM with nested paging, kvm-amd); the daemon, the hooks and cloud-hypervisor run in L1, the test guest (L2) boots the same bzImage and initramfs" ;;
	esac
}

# ch_nested_exec OUT MEM_MIB SMP TIMEOUT COMMAND...: ch_l1_run, then COMMAND's
# count added to PASSED/FAILED, and a failure of L1 itself (it never booted, or
# ended before COMMAND did) or of COMMAND without a count as one more.
ch_nested_exec() {
	local out=$1 rc=0 counts p=0 f=0
	ch_l1_run "$@" || rc=$?
	counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out/l1/run.log" 2>/dev/null | tail -n 1)
	if [[ -n $counts ]]; then
		p=${counts%% passed*}
		f=${counts#*, }
		f=${f%% failed*}
	fi
	PASSED=$((PASSED + p))
	FAILED=$((FAILED + f))
	if ((rc == 90 || rc == 91)); then
		fail l1 "$L1_FAILURE"
	elif [[ -z $counts ]]; then
		fail l1-run "$(basename "$5") in L1 exited with status $rc without a count (see $out/l1/run.log)"
	elif ((rc != 0 && f == 0)); then
		fail l1-run "$(basename "$5") in L1 exited with status $rc"
	fi
	say "nested run: L1's console $out/l1/console.log, the run in L1 $out/l1/run.log"
}

# fsops for the host (lockwatch, trylock), built here once per version of
# fsops.c: gcc in L1 would take a minute under TCG. Prints its path.
ch_fsops_host() {
	local src="$HERE/guest/fsops.c" bin="$L1_DIR/fsops-host" sum
	sum=$(sha256sum "$src" | cut -d' ' -f1)
	if [[ ! -x $bin || $(cat "$bin.sum" 2>/dev/null) != "$sum" ]]; then
		mkdir -p "$L1_DIR"
		gcc -O2 -Wall -o "$bin" "$src" || return 1
		echo "$sum" >"$bin.sum"
	fi
	echo "$bin"
}

ch_hw_kvm() { [[ -c /dev/kvm && -r /dev/kvm && -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; }

# ch_mode: prints direct or nested, or returns 1 with CH_MODE_WHY.
ch_mode() {
	CH_MODE_WHY=""
	case ${VMTEST_CH_MODE:-} in direct | nested) echo "$VMTEST_CH_MODE"; return 0 ;; esac
	if ch_hw_kvm; then echo direct; return 0; fi
	if [[ ${VMTEST_IN_L1:-0} == 1 ]]; then
		CH_MODE_WHY="inside L1 but /dev/kvm is not usable (kvm-amd did not load?)"
		return 1
	fi
	if ! command -v qemu-system-x86_64 >/dev/null; then
		CH_MODE_WHY="no hardware KVM and no qemu-system-x86_64 to run an L1 guest under TCG"
		return 1
	fi
	echo nested
}

# The guest kernel's module tree (unpacked by build-guest.sh; a package's tree
# has no modules.dep: the dependencies are read from each module).
l1_modules_dir() {
	local kv d
	kv=$(cat "$REPO/build/guest/kernel-version" 2>/dev/null) || return 1
	for d in "$REPO/build/guest/kernel/${kv% *}_${kv#* }/root/lib/modules/"*/; do
		[[ -d $d/kernel ]] && { echo "${d%/}"; return 0; }
	done
	return 1
}

# l1_module_order MODDIR MODULE...: the modules and what they need, each after
# its dependencies (the "depends=" of each module's .modinfo: no kmod needed),
# as paths relative to MODDIR.
l1_module_order() {
	python3 - "$@" <<'PY'
import lzma, os, re, subprocess, sys
top = sys.argv[1]
paths = {}
for d, _, files in os.walk(top):
    for f in files:
        if ".ko" in f:
            paths[f.split(".ko")[0].replace("-", "_")] = os.path.join(d, f)
order, seen = [], set()
def visit(m):
    m = m.replace("-", "_")
    if m in seen:
        return
    seen.add(m)
    if m not in paths:
        sys.exit("no module %s under %s" % (m, top))
    p = paths[m]
    if p.endswith(".xz"):
        data = lzma.open(p).read()
    elif p.endswith(".zst"):
        data = subprocess.run(["zstd", "-qdc", p], capture_output=True, check=True).stdout
    else:
        data = open(p, "rb").read()
    found = re.search(rb"(?:^|\0)depends=([^\0]*)", data)
    deps = found.group(1).decode() if found else ""
    for dep in filter(None, deps.split(",")):
        visit(dep)
    order.append(os.path.relpath(paths[m], top))
for m in sys.argv[2:]:
    visit(m)
print("\n".join(order))
PY
}

# The L1 initramfs (busybox, the modules for 9p and kvm-amd, l1/init), rebuilt
# when its inputs change. Prints its path.
l1_initramfs() {
	local mods stamp root p n order=()
	mods=$(l1_modules_dir) || die "no guest kernel modules under $REPO/build/guest/kernel (run vm-tests/build-guest.sh)"
	stamp=$( {
		cat "$HERE/l1/init" "$HERE/ch-lib.sh"
		echo "$mods"
		sha256sum /bin/busybox
	} | sha256sum | cut -d' ' -f1)
	if [[ -f $L1_DIR/initramfs.cpio.gz && $(cat "$L1_DIR/stamp" 2>/dev/null) == "$stamp" ]]; then
		echo "$L1_DIR/initramfs.cpio.gz"
		return 0
	fi
	mkdir -p "$L1_DIR"
	root=$(mktemp -d "$L1_DIR/.root.XXXXXX")
	mkdir -p "$root"/{bin,proc,sys,dev,tmp,modules,newroot}
	install -m 0755 /bin/busybox "$root/bin/busybox"
	for p in $(/bin/busybox --list); do [[ -e $root/bin/$p ]] || ln -s busybox "$root/bin/$p"; done
	mapfile -t order < <(l1_module_order "$mods" 9p 9pnet_virtio kvm_amd)
	((${#order[@]} > 0)) || die "no modules for 9p and kvm_amd found under $mods"
	for p in "${order[@]}"; do
		n=$(basename "$p")
		n=${n%%.ko*}
		case "$p" in
		*.xz) xz -dc "$mods/$p" ;;
		*.zst) zstd -qdc "$mods/$p" ;;
		*) cat "$mods/$p" ;;
		esac >"$root/modules/$n.ko" || die "cannot unpack $mods/$p"
		echo "$n" >>"$root/modules/order"
	done
	install -m 0755 "$HERE/l1/init" "$root/init"
	(cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc -R 0:0 --quiet) | gzip -6 >"$L1_DIR/initramfs.cpio.gz.tmp"
	mv "$L1_DIR/initramfs.cpio.gz.tmp" "$L1_DIR/initramfs.cpio.gz"
	echo "$stamp" >"$L1_DIR/stamp"
	rm -rf "$root"
	echo "$L1_DIR/initramfs.cpio.gz"
}

# l1_visible PATH: PATH as L1 sees it. L1 has tmpfs on /tmp, /var/tmp, /run and
# /root (virtiofsd's `cargo install` puts it in /root/.cargo/bin): a file there is copied into OUT/l1/bin (OUT: L1's output directory, which L1
# shares with the host) and that copy's path printed.
l1_visible() { # l1_visible PATH OUT
	local p
	p=$(readlink -f "$1")
	case "$p" in
	/tmp/* | /var/tmp/* | /run/* | /root/*)
		mkdir -p "$2/l1/bin"
		cp -f "$p" "$2/l1/bin/" || die "cannot copy $p for L1"
		echo "$2/l1/bin/$(basename "$p")"
		;;
	*) echo "$p" ;;
	esac
}

l1_stop() {
	[[ -n $L1_QPID ]] || return 0
	stop_pid "$L1_QPID" 2
	L1_QPID=""
}

# ch_l1_run OUT MEM_MIB SMP TIMEOUT COMMAND...: boots L1 and runs COMMAND in it
# (bash, in REPO, with the VMTEST_*, CH_*, L1_*, FIOVERIFY_* and NFILES, BIG_MIB,
# PAR_MIB variables of this environment),
# its output streamed here as it comes; returns COMMAND's exit status, or 90 when
# L1 never booted in L1_BOOT_ATTEMPTS tries, 91 when it ended before COMMAND did
# (L1_FAILURE says why). OUT (the host's directory, shared read-write at the same
# path) gets l1/console.log (L1's console), l1/run.log (COMMAND's output),
# l1/dmesg.log. The host's root is shared read-only: COMMAND reads the repository,
# the binaries and the guest as they are here, and writes under OUT, /tmp,
# /var/tmp or /run (tmpfs in L1).
ch_l1_run() {
	local out=$1 mem=$2 smp=$3 timeout=$4 initrd attempt t0 tailpid v
	shift 4
	L1_FAILURE=""
	[[ $out == /* && $out != *[[:space:],]* ]] || die "L1's output directory must be an absolute path without spaces or commas: $out"
	case "$out/" in /tmp/* | /var/tmp/* | /run/* | /root/*) die "L1's output directory cannot be under /tmp, /var/tmp, /run or /root (tmpfs in L1): $out" ;; esac
	initrd=$(l1_initramfs) || { L1_FAILURE="cannot build L1's initramfs (above)"; return 90; }
	VMTEST_FSOPS_HOST=$(ch_fsops_host) || { L1_FAILURE="cannot build fsops for the host"; return 90; }
	export VMTEST_FSOPS_HOST
	mkdir -p "$out/l1"
	rm -f "$out/l1/rc" "$out/l1/run.log" "$out/l1/dmesg.log"
	{
		echo "# written by ch_l1_run (vm-tests/ch-lib.sh); run by vm-tests/l1/stage2.sh in L1"
		for v in $(compgen -e | grep -E '^(VMTEST_|CH_|L1_|NFILES$|BIG_MIB$|PAR_MIB$|FIOVERIFY_)' | grep -vx VMTEST_IN_L1); do
			printf 'export %s=%q\n' "$v" "${!v}"
		done
		printf 'cd %q || exit 99\n' "$REPO"
		printf '%q ' exec "$@"
		echo
	} >"$out/l1/commands.sh"
	for attempt in $(seq "$L1_BOOT_ATTEMPTS"); do
		: >"$out/l1/console.log"
		t0=$SECONDS
		qemu-system-x86_64 -machine q35 -accel "$L1_ACCEL" -cpu max -smp "$smp" -m "${mem}M" \
			-kernel "$REPO/build/guest/vmlinuz" -initrd "$initrd" \
			-append "console=ttyS0 panic=-1 quiet $L1_CMDLINE vmtest.l1out=$out vmtest.l1repo=$REPO" \
			-virtfs "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap" \
			-virtfs "local,path=$out,mount_tag=out,security_model=passthrough,multidevs=remap" \
			-nodefaults -display none -monitor none -serial "file:$out/l1/console.log" \
			-nic none -no-reboot >"$out/l1/qemu.log" 2>&1 &
		L1_QPID=$!
		say "L1 (attempt $attempt/$L1_BOOT_ATTEMPTS): QEMU -accel $L1_ACCEL -cpu max, $smp cpu(s), ${mem} MiB, pid $L1_QPID; console $out/l1/console.log"
		until grep -aq -e '^VMTEST-L1 STAGE2' -e '^VMTEST-L1 FATAL' "$out/l1/console.log" 2>/dev/null; do
			if ! kill -0 "$L1_QPID" 2>/dev/null; then
				wait "$L1_QPID" 2>/dev/null || true
				if ! grep -aq '^VMTEST-L1 INIT' "$out/l1/console.log"; then
					L1_FAILURE="QEMU (L1) exited before L1's init ran: $(tail -n 3 "$out/l1/qemu.log" | tr '\n' ' ')"
					L1_QPID=""
					show_tail "$out/l1/console.log" "L1 console"
					return 90
				fi
				break
			fi
			((SECONDS - t0 <= L1_BOOT_TIMEOUT)) || break
			sleep 0.5
		done
		if grep -aq '^VMTEST-L1 FATAL' "$out/l1/console.log"; then
			L1_FAILURE="L1 could not set up: $(grep -a '^VMTEST-L1 FATAL' "$out/l1/console.log" | head -n 1 | tr -d '\r')"
			l1_stop
			show_tail "$out/l1/console.log" "L1 console"
			return 90
		fi
		if grep -aq '^VMTEST-L1 STAGE2' "$out/l1/console.log"; then
			say "L1 up after $((SECONDS - t0)) s: $(grep -a '^VMTEST-L1 ROOT' "$out/l1/console.log" | tr -d '\r' | cut -d' ' -f3-); $(grep -a '^VMTEST-L1 STAGE2' "$out/l1/console.log" | tr -d '\r' | cut -d' ' -f3-)"
			break
		fi
		say "L1 boot attempt $attempt/$L1_BOOT_ATTEMPTS never reached its stage 2 within ${L1_BOOT_TIMEOUT} s (a TCG boot that oopsed early is retried)"
		show_tail "$out/l1/console.log" "L1 console"
		cp "$out/l1/console.log" "$out/l1/console.failed-boot-$attempt.log"
		l1_stop
		if ((attempt == L1_BOOT_ATTEMPTS)); then
			L1_FAILURE="L1 never reached its stage 2 in $L1_BOOT_ATTEMPTS boots"
			return 90
		fi
	done
	# COMMAND's output, as L1 writes it through to the host.
	touch "$out/l1/run.log"
	tail -n +1 -F --pid="$L1_QPID" "$out/l1/run.log" 2>/dev/null &
	tailpid=$!
	t0=$SECONDS
	while kill -0 "$L1_QPID" 2>/dev/null; do
		if ((SECONDS - t0 > timeout)); then
			L1_FAILURE="COMMAND did not end within ${timeout} s: L1 stopped"
			l1_stop
			break
		fi
		sleep 1
	done
	wait "$L1_QPID" 2>/dev/null || true
	L1_QPID=""
	sleep 0.5
	kill "$tailpid" 2>/dev/null
	wait "$tailpid" 2>/dev/null || true
	if [[ -s $out/l1/rc ]]; then
		return "$(cat "$out/l1/rc")"
	fi
	[[ -n $L1_FAILURE ]] || L1_FAILURE="L1 ended before COMMAND did (no $out/l1/rc)"
	show_tail "$out/l1/console.log" "L1 console"
	return 91
}
