# Guest side of the qos suite (qos.setup.sh): qa is limited to 200 requests/s and
# 1 MiB/s, qb is not. Every request to qa must still be answered correctly, only
# later; qb must keep working while qa is saturated. qos.hook.sh checks from the
# host (the metrics) that qa's requests really waited, and lifts the limit.
. /lib/vmtest.sh

WAIT=${WAIT:-120}
A=$M/qa
B=$M/qb

# since T0: seconds from T0 (a `now`)
since() { awk "BEGIN {printf \"%.2f\", $(now) - $1}"; }

# wait_ack STEP: the hook's answer to STEP (in qb/.acks) must be "ok"
wait_ack() {
	wait_until "$WAIT" test -e "$B/.acks/$1"
	_r=$(cat "$B/.acks/$1")
	[ "$_r" = ok ] || die "host step $1: $_r"
}

# Reads of the throttled volume return the host's bytes.
t_throttled_reads_are_correct() {
	_t0=$(now)
	eq "1 MiB in 4 KiB reads" "$(dd if="$A/data.bin" bs=4k 2>/dev/null | sha256sum | cut -d' ' -f1)" "$(cat "$A/data.sha")"
	info "qa: 1 MiB read in 4 KiB reads in $(since "$_t0") s (limit 1 MiB/s)"
	eq "whole-file read" "$(sha "$A/data.bin")" "$(cat "$A/data.sha")"
}

# Writes to the throttled volume land whole (qos.host.sh checks the host's copy).
t_throttled_writes_are_correct() {
	dd if=/dev/urandom of=/tmp/w.bin bs=4k count=128 2>/dev/null
	_t0=$(now)
	dd if=/tmp/w.bin of="$A/w.bin" bs=4k 2>/dev/null || die "dd to qa"
	sync
	info "qa: 512 KiB written in 4 KiB writes in $(since "$_t0") s"
	eq "read back" "$(sha "$A/w.bin")" "$(sha /tmp/w.bin)"
	sha /tmp/w.bin >"$A/w.sha"
}

# Metadata storms on the throttled volume: every create, stat, listing, read and
# unlink answered right.
t_throttled_metadata_is_correct() {
	mkdir "$A/m"
	_t0=$(now)
	for i in $(seq 1 40); do echo "file $i" >"$A/m/f$i"; done
	eq "entries" "$(ls "$A/m" | wc -l)" 40
	for i in 1 20 40; do eq "f$i" "$(cat "$A/m/f$i")" "file $i"; done
	for i in $(seq 1 40); do rm "$A/m/f$i"; done
	rmdir "$A/m"
	errno ENOENT stat "$A/m"
	info "qa: 40 files created, listed, read and removed in $(since "$_t0") s (limit 200 requests/s)"
}

# qb keeps working, correctly, while a loop keeps qa at its limit.
t_neighbour_works_while_qa_is_saturated() {
	(while :; do stat "$A/data.bin" >/dev/null; done) &
	_hog=$!
	usleep 300000
	_t0=$(now)
	mkdir "$B/n"
	for i in $(seq 1 50); do echo "n $i" >"$B/n/f$i"; done
	eq "qb entries" "$(ls "$B/n" | wc -l)" 50
	for i in 1 25 50; do eq "qb f$i" "$(cat "$B/n/f$i")" "n $i"; done
	_dt=$(since "$_t0")
	kill $_hog
	wait $_hog 2>/dev/null || true
	rm -r "$B/n"
	info "qb: 50 files created and listed in $_dt s while qa was saturated"
}

# The host sees that qa's requests waited and qb's did not, and none failed.
t_host_saw_qa_throttled() {
	host_step metrics
	wait_ack metrics
}

# The limit lifted at runtime: qa answers at once, and nothing more waits.
t_limit_lifted_at_runtime() {
	host_step lift
	wait_ack lift
	for i in $(seq 1 200); do stat "$A/data.bin" >/dev/null; done
	eq "read after the lift" "$(sha "$A/data.bin")" "$(cat "$A/data.sha")"
	host_step after-lift
	wait_ack after-lift
}

run throttled-reads-are-correct t_throttled_reads_are_correct
run throttled-writes-are-correct t_throttled_writes_are_correct
run throttled-metadata-is-correct t_throttled_metadata_is_correct
run neighbour-works-while-qa-is-saturated t_neighbour_works_while_qa_is_saturated
run host-saw-qa-throttled t_host_saw_qa_throttled
run limit-lifted-at-runtime t_limit_lifted_at_runtime
