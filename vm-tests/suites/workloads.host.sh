#!/usr/bin/env bash
# Host checks of the workloads suite, after the guest powered off:
#   workloads.host.sh SHARED_DIR
# Every workload the guest timed has a start and an end sample of the daemon's
# CPU time (workloads.hook.sh), and the share holds no tree, storm or database
# any more. Prints each workload's daemon CPU and guest wall time as INFO lines.
set -euo pipefail

S=${1:?usage: workloads.host.sh SHARED_DIR}
SAMPLES=$VMTEST_LOG_DIR/workloads-samples.txt
SERIAL=${VMTEST_SERIAL:-$VMTEST_LOG_DIR/serial.log}

walls=$(tr -d '\r' <"$SERIAL" | awk '/^VMTEST INFO workload [^ ]+ wall / {sub("s$", "", $6); print $4, $6}')
missing=""
while read -r name wall; do
	[[ -n $name ]] || continue
	line=$(awk -v n="$name" '$2 == n {d[$1] = $4; q[$1] = $5; tck = $6}
		END {if (("start" in d) && ("end" in d)) printf "%.2f %.2f", (d["end"] - d["start"]) / tck, (q["end"] - q["start"]) / tck}' "$SAMPLES")
	if [[ -z $line ]]; then
		missing+=" $name"
		continue
	fi
	read -r dcpu qcpu <<<"$line"
	echo "VMTEST INFO workload $name: guest wall ${wall}s, daemon CPU ${dcpu}s, QEMU CPU ${qcpu}s"
done <<<"$walls"
if [[ -z $walls ]]; then
	echo "VMTEST FAIL host-cpu-samples: the guest timed no workload"
elif [[ -n $missing ]]; then
	echo "VMTEST FAIL host-cpu-samples: no start or end sample for:$missing"
else
	echo "VMTEST PASS host-cpu-samples"
fi
left=$(cd "$S" && find wl -mindepth 1 -maxdepth 1 ! -name .acks 2>/dev/null | head -n 3 | tr '\n' ' ')
if [[ -z $left ]]; then
	echo "VMTEST PASS host-share-clean"
else
	echo "VMTEST FAIL host-share-clean: left in the share: $left"
fi
