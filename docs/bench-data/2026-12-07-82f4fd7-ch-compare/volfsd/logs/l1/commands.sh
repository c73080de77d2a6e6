# written by ch_l1_run (vm-tests/ch-lib.sh); run by vm-tests/l1/stage2.sh in L1
export CH_BIN=/var/cache/cloud-hypervisor/v53.0/bin/cloud-hypervisor
export CH_REMOTE=/var/cache/cloud-hypervisor/v53.0/bin/ch-remote
export VMTEST_FSOPS_HOST=/work/main/build/l1/fsops-host
cd /work/main || exit 99
exec vm-tests/run-ch.sh --group ci --daemon /work/chbin/volfsd --daemon /work/chbin/volfsd --log-dir /work/main/build/vm-logs/ch 
