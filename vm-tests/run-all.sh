#!/usr/bin/env bash
# Run the VM suites CI needs and print one summary line "N passed, N failed".
#
# Usage: vm-tests/run-all.sh [--daemon PATH] [--require-cloud-hypervisor] [--weekly]
#                            [--only LABEL[,LABEL]] [--except LABEL[,LABEL]]
#   --daemon PATH   daemon under test (default target/release/volfsd)
#   --only, --except  run only these suites, or all but these (labels as below;
#                   tests/run.sh runs the cloud-hypervisor line last, on its own)
#   --require-cloud-hypervisor  the cloud-hypervisor lines fail (saying why)
#                   instead of skipping when it cannot run a guest (.ci/run)
#   --weekly        run WEEKLY_SUITES instead: those too slow for every CI run
# Each suite is one line in SUITES below: a label, then run-vm.sh arguments;
# or a label, "run:SCRIPT" and that script's arguments, to run
# vm-tests/SCRIPT --daemon PATH ARGS instead of run-vm.sh (it must end with
# the same "N passed, N failed" line).
# A suite's own pass/fail counts are summed into the total; a suite that
# produced no count but failed counts as one failure.
set -Eeuo pipefail
# A failure always says what failed (set -e alone ends the script without a word).
trap 'echo "${BASH_SOURCE[0]##*/}: line $LINENO: \"$BASH_COMMAND\" failed (status $?)" >&2' ERR

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
DAEMON="$REPO/target/release/volfsd"
CH_REQUIRE=()
ONLY=""
EXCEPT=""

SUITES=(
	"basic-qemu-2q       --vmm qemu --suite basic --queues 2 --smp 2"
	"shares-qemu-2q      --vmm qemu --suite shares --queues 2 --smp 2"
	"control-qemu        --vmm qemu --suite control"
	"reboot-qemu         --vmm qemu --suite reboot --allow-reboot"
	"pjdfstest-qemu      --vmm qemu --suite pjdfstest"
	# nodes kept by file handle instead of O_PATH fds (the basic suite so is weekly;
	# the host suites hostile_guest and fs_ops run with file handles in every run)
	"pjdfstest-file-handles --vmm qemu --suite pjdfstest --daemon-args --inode-file-handles=prefer"
	# launcher features: POSIX ACLs, the guest's O_DIRECT, --cache=metadata
	"features-qemu       --vmm qemu --suite features"
	# --translate-uid/--translate-gid seen from the guest
	"idmap-qemu          --vmm qemu --suite idmap"
	# per-volume QoS: a throttled volume answers every request correctly, later;
	# its neighbour keeps working; the limit is lifted at runtime
	"qos-qemu            --vmm qemu --suite qos"
	# Debian's libvirt 9.0 finds volfsd through a vhost-user descriptor, starts it
	# with its own argument vector for a domain's <filesystem>, the guest uses it
	"libvirt             run:run-libvirt.sh"
	# basic suite with volfsd and QEMU run by a non-root user (user namespace)
	"basic-unprivileged  run:run-unprivileged.sh"
	# two sandboxes (two VMs, two volfsd) on one volume: A rw, B ro
	"pair-local          run:run-pair.sh"
	# the same on two JuiceFS clients of one volume, as two nodes mount it
	"pair-juicefs        run:run-pair.sh --backend juicefs"
	# the reference JuiceFS volume plugin, driven as a node agent drives it
	"plugin-juicefs      run:run-plugin.sh"
	# live migration, snapshot/restore and clones under QEMU 10 (issue 24): a working
	# guest moved with its fds, readdir position, cwd, locks, shared map and fio intact
	"migration-live      run:run-migration.sh --mode live"
	# a snapshot restored on the share, then twice at once into copies of it
	"migration-clone     run:run-migration.sh --mode clone"
	# a snapshot of a running VM that carries on (a checkpoint)
	"migration-checkpoint run:run-migration.sh --mode checkpoint"
	# a held file deleted between snapshot and restore: guest-error, abort, a live abort
	"migration-gone      run:run-migration.sh --mode gone"
	# runtime-attached, read-only and rate-limited volumes, nodes kept by file handle
	"migration-variants  run:run-migration.sh --mode variants"
	# --upgradable (issue 26): 20 upgrades under fio with verify, a metadata loop and
	# held locks, alternating two version strings; failing upgrades refused
	"upgrade-qemu        --vmm qemu --suite upgrade"
	# --upgradable (issue 26): SIGKILL of the serving process every 2 s, 20 times,
	# under fio with verify, a create/rename/unlink loop and fsynced records
	"crash-qemu          --vmm qemu --suite crash"
	# what developers run (issue 27), small and checked only: untar, find+stat, git
	# add/commit/status, an npm-style storm, SQLite transactions, rm -rf (1.5-2
	# min; benches/workloads.sh runs it at full size against virtiofsd)
	"workloads-qemu      --vmm qemu --suite workloads"
	# cloud-hypervisor (issue 34): real guests, nested in an L1 QEMU TCG guest where
	# the host has no hardware KVM (vm-tests/ch-lib.sh); one L1 boot runs the
	# scenarios in turn (run-ch.sh --list): snapshot and restore with two clones,
	# live migration (TCP, local=on there and back), reconnect to a daemon
	# restarted whole, basic and fio verify on 2 request queues. The rest is weekly.
	"cloud-hypervisor    run:run-ch.sh --group ci"
	# Add more suites here, one line each.
)

# Too slow for every CI run (vm-tests/run-all.sh --weekly).
WEEKLY_SUITES=(
	# the basic suite on nodes kept by file handle (about 2.5 minutes; moved out of
	# every run to make room for the package test and the launcher-feature suites)
	"basic-file-handles  --vmm qemu --suite basic --daemon-args --inode-file-handles=prefer"
	# the basic suite with the share on one JuiceFS client (about 3.5 minutes;
	# JuiceFS itself is in every run through pair-juicefs and plugin-juicefs)
	"basic-juicefs       run:run-backend.sh juicefs"
	# the basic suite on s3fs over a local S3 endpoint: about 12 minutes under TCG,
	# most of it 10,000 files listed through the S3 API
	"basic-s3fs          run:run-backend.sh s3fs --timeout 2400"
	# cloud-hypervisor, nested (one L1 boot): basic and fio verify with 1 request
	# queue, shares and control with 1 and 2, crash, upgrade (about 25-40 minutes
	# nested; the lines of every run are the "cloud-hypervisor" one above)
	"cloud-hypervisor-weekly run:run-ch.sh --group weekly"
)

while [[ $# -gt 0 ]]; do
	case "$1" in
	--daemon) DAEMON=${2:?}; shift ;;
	--require-cloud-hypervisor) CH_REQUIRE=(--require) ;;
	--weekly) SUITES=("${WEEKLY_SUITES[@]}") ;;
	--only) ONLY=",${2:?}," ; shift ;;
	--except) EXCEPT=",${2:?}," ; shift ;;
	-h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "run-all: unknown option: $1" >&2; exit 2 ;;
	esac
	shift
done

total_pass=0
total_fail=0
summary=()
start=$SECONDS

for entry in "${SUITES[@]}"; do
	read -r label args <<<"$entry"
	[[ -z $ONLY || $ONLY == *",$label,"* ]] || continue
	[[ -z $EXCEPT || $EXCEPT != *",$label,"* ]] || continue
	script=run-vm.sh
	if [[ $args == run:* ]]; then
		read -r script args <<<"$args"
		script=${script#run:}
	fi
	echo "=== $label: $script $args"
	t0=$SECONDS
	log=$(mktemp)
	extra=()
	[[ $args == *cloud-hypervisor* || $script == run-ch*.sh ]] && extra=("${CH_REQUIRE[@]}")
	rc=0
	# shellcheck disable=SC2086 # args is a word list by design
	"$HERE/$script" --daemon "$DAEMON" $args "${extra[@]}" 2>&1 | tee "$log" || rc=$?
	counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1 || true)
	note=""
	grep -q 'not available: guest suite not run' "$log" && note=" (not available here: not run)"
	if [[ -n $counts ]]; then
		p=${counts%% passed*}
		f=${counts#*, }
		f=${f%% failed*}
	else
		p=0 f=0
	fi
	rm -f "$log"
	# A non-zero exit without a failure counted (e.g. a setup error) is a failure.
	if [[ $rc != 0 && $f == 0 ]]; then f=1; fi
	total_pass=$((total_pass + p))
	total_fail=$((total_fail + f))
	summary+=("$(printf '%-20s %3s passed, %s failed, exit %s, %ss%s' "$label" "$p" "$f" "$rc" $((SECONDS - t0)) "$note")")
done

echo "=== summary ($((SECONDS - start))s)"
printf '  %s\n' "${summary[@]}"
echo "$total_pass passed, $total_fail failed"
[[ $total_fail == 0 ]]
