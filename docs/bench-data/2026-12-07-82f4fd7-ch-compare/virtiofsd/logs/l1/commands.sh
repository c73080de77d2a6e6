# written by ch_l1_run (vm-tests/ch-lib.sh); run by vm-tests/l1/stage2.sh in L1
export CH_BIN=/var/cache/cloud-hypervisor/v53.0/bin/cloud-hypervisor
export CH_REMOTE=/var/cache/cloud-hypervisor/v53.0/bin/ch-remote
export VMTEST_FSOPS_HOST=/work/main/build/l1/fsops-host
cd /work/main || exit 99
exec vm-tests/run-ch.sh --log-dir /work/chbin/ch-compare/virtiofsd/logs --group virtiofsd --only vfs-basic-1q\,vfs-basic-2q\,vfs-snapshot\,vfs-live\,vfs-reconnect\,vfs-crash --daemon /root/.cargo/bin/virtiofsd --daemon /work/chbin/ch-compare/virtiofsd/logs/l1/bin/virtiofsd --log-dir /work/chbin/ch-compare/virtiofsd/logs 
