#!/usr/bin/env bash
# Host side of the demo suite: the guest's file must be in the shared dir.
set -euo pipefail
SHARE=${1:?usage: demo.host.sh SHARED_DIR}
f="$SHARE/hello-from-guest.txt"
if [[ -f $f ]] && grep -q '^hello from the guest' "$f"; then
	echo "VMTEST PASS demo-host-sees-guest-file"
else
	echo "VMTEST FAIL demo-host-sees-guest-file: $f missing or wrong"
fi
