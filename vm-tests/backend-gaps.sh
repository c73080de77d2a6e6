# backend_lacks FEATURE for host scripts (bash): the same table as the guest's
# (vm-tests/guest/backend-gaps), for the backend in VMTEST_BACKEND.
backend_lacks() {
	[[ -n ${VMTEST_BACKEND:-} ]] || return 1
	grep -qx "$VMTEST_BACKEND $1" "$(dirname "${BASH_SOURCE[0]}")/guest/backend-gaps"
}
