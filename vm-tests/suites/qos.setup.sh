#!/usr/bin/env bash
# Host setup of the qos suite, run by run-vm.sh before the first boot:
#   qos.setup.sh SHARED_DIR
# SharedDir gets qa, limited to 200 requests/s and 1 MiB/s (token buckets of 20
# requests per 100 ms and 256 KiB per 250 ms), and qb, unlimited. The daemon
# has a control socket, through which qos.hook.sh reads the metrics and lifts
# qa's limit at runtime.
set -euo pipefail

S=${1:?usage: qos.setup.sh SHARED_DIR}
W=${VMTEST_WORK:?}

rm -rf "${S:?}"/{qa,qb}
mkdir -p "$S"/{qa,qb}
head -c 1048576 /dev/urandom >"$S/qa/data.bin"
sha256sum "$S/qa/data.bin" | cut -d' ' -f1 >"$S/qa/data.sha"
chmod 0777 "$S/qa" "$S/qb"

printf '%s\n' --control-socket "$W/ctl.sock" \
	--allowed-dir "qa,ops_size=20,ops_refill_time_ms=100,bw_size=262144,bw_refill_time_ms=250" \
	--allowed-dir qb >"$VMTEST_DAEMON_ARGS_FILE"
echo "qos setup done in $S"
