#!/bin/bash
# Stage 2 of the L1 guest (vm-tests/ch-lib.sh, ch_l1_run), run by l1/pid1.py on the
# host's root (read-only) with /dev/kvm from the nested kvm-amd:
#   stage2.sh OUT REPO
# Runs OUT/l1/commands.sh (written by the host) in REPO with its output in
# OUT/l1/run.log, writes its exit status to OUT/l1/rc and L1's kernel log to
# OUT/l1/dmesg.log. OUT is the host's directory, written through.
OUT=${1:?usage: stage2.sh OUT REPO}
REPO=${2:?usage: stage2.sh OUT REPO}
set -u
echo "VMTEST-L1 STAGE2 $(nproc) cpus, $(awk '/MemTotal/ {print int($2 / 1024) " MiB"}' /proc/meminfo)"
# Loopback (a migration over TCP), a host name for the logs.
ip link set lo up 2>/dev/null || busybox ip link set lo up 2>/dev/null || true
hostname l1 2>/dev/null || true
ulimit -n 1048576 2>/dev/null || ulimit -n 65536 2>/dev/null || true
cd "$REPO" || { echo 99 >"$OUT/l1/rc"; exit 1; }
export VMTEST_IN_L1=1
t0=$SECONDS
bash "$OUT/l1/commands.sh" >"$OUT/l1/run.log" 2>&1 </dev/null
rc=$?
dmesg >"$OUT/l1/dmesg.log" 2>&1 || true
echo "$rc" >"$OUT/l1/rc.tmp" && mv "$OUT/l1/rc.tmp" "$OUT/l1/rc"
sync
echo "VMTEST-L1 DONE rc=$rc after $((SECONDS - t0)) s"
