# shellcheck shell=bash
# A quiet machine for a measurement, shared by benches/compare.sh and benches/qos.sh.
# The caller sets OUT (quiet_check appends its verdict to $OUT/env.txt), ALLOW_BUSY
# (1: measure anyway, and say so) and QUIET_NAME (its name in messages), and has
# `say`.

# Processes that would share the cores with a measurement: other VMs, builds, fuzzers,
# other vhost-user daemons (the caller's own are stopped between runs). Matched on the
# program's name (comm, at most 15 characters), not its command line, so that a
# script whose arguments name volfsd is not company.
company() {
	ps -e -o comm= | awk '/^(qemu-system-.*|cargo|rustc|cc1|cc1plus|ld|volfsd|virtiofsd|cloud-hyperviso.*|fio|stress-ng|afl-fuzz)$/' |
		sort | uniq -c | awk '{printf "%s%s×%s", sep, $2, $1; sep=","}'
}

load1() { cut -d' ' -f1 /proc/loadavg; }

# quiet_check: waits up to 2 minutes for a load average under 1 and no company;
# then refuses (exit 3) or, with ALLOW_BUSY=1, measures and marks the data.
quiet_check() {
	local waited=0 c l
	while :; do
		c=$(company) l=$(load1)
		if [[ -z $c ]] && awk -v l="$l" 'BEGIN {exit !(l < 1.0)}'; then
			echo "quiet: yes (load average $l, no other QEMU, cargo or daemon)" >>"$OUT/env.txt"
			return
		fi
		if ((waited >= 120)); then
			if [[ $ALLOW_BUSY == 1 ]]; then
				echo "quiet: NO (load average $l; running: ${c:-nothing else}) - measured anyway (--allow-busy)" >>"$OUT/env.txt"
				say "machine not quiet (load $l; ${c:-}); measuring anyway (--allow-busy)"
				return
			fi
			echo "$QUIET_NAME: error: machine not quiet after 2 minutes (load average $l; running: ${c:-nothing else}); stop them or pass --allow-busy" >&2
			exit 3
		fi
		sleep 5
		waited=$((waited + 5))
	done
}
