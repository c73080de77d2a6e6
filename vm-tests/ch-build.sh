#!/usr/bin/env bash
# Finds or builds the cloud-hypervisor the VM suites run (ch-lib.sh, ch_find): CH_BIN,
# else cloud-hypervisor on PATH, else ../shared/cloud-hypervisor/build.sh next to
# the repository, which builds it once per machine into its cache (about 4 minutes
# on 2 cores; later runs find it there). tests/run.sh runs this before the VM
# suites, so that the first build is its own line in the CI log, with its time.
#
# Usage: vm-tests/ch-build.sh [--require] [--ch-version V]
#   --require       no cloud-hypervisor is a failure (CI); otherwise it is said
#                   and the count is "0 passed, 0 failed"
#   --ch-version V  v53.0 (default) or main
# Ends with "N passed, N failed".
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=runner-lib.sh
. "$HERE/runner-lib.sh"
# shellcheck source=ch-lib.sh
. "$HERE/ch-lib.sh"
say() { echo "ch-build: $*"; }
die() {
	echo "ch-build: error: $*" >&2
	exit 2
}
REQUIRE=0
while [[ $# -gt 0 ]]; do
	case "$1" in
	--require) REQUIRE=1 ;;
	--ch-version) CH_VERSION=${2:?}; shift ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option: $1" ;;
	esac
	shift
done
PASSED=0
FAILED=0
v=$(ch_version_name "$CH_VERSION")
cached=0
[[ -f /var/cache/cloud-hypervisor/$v/.done ]] && cached=1
t0=$SECONDS
if ch_find; then
	if [[ -n ${CH_REMOTE:-} && -x $CH_REMOTE ]]; then
		pass cloud-hypervisor-build
	else
		fail cloud-hypervisor-build "$CH_BIN has no ch-remote next to it or on PATH (CH_REMOTE): snapshots and migrations need it"
	fi
	case $CH_FROM in
	built*)
		if ((cached)); then
			say "$CH_VERSION_TEXT: cached ($CH_FROM)"
		else
			say "$CH_VERSION_TEXT: first build on this machine took $((SECONDS - t0)) s ($CH_FROM)"
		fi
		;;
	*) say "$CH_VERSION_TEXT: $CH_BIN (from $CH_FROM), nothing built" ;;
	esac
elif ((REQUIRE)); then
	fail cloud-hypervisor-build "$CH_MISSING"
else
	say "not available: $CH_MISSING (the cloud-hypervisor suites say so and are not run)"
fi
echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
