#!/usr/bin/env bash
# Host setup of the features suite: the launcher features of virtiofsd that
# volfsd implements, in one boot: POSIX ACLs (--posix-acl), the guest's O_DIRECT
# honoured (--allow-direct-io) and attributes cached while data is not
# (--cache=metadata, which overrides run-vm.sh's --cache: the last value wins).
#   features.setup.sh SHARED_DIR
set -euo pipefail
S=${1:?usage: features.setup.sh SHARED_DIR}
rm -rf "${S:?}"/feat && mkdir -p "$S/feat" && chmod 0777 "$S/feat"
printf '%s\n' --posix-acl --allow-direct-io --cache=metadata >"$VMTEST_DAEMON_ARGS_FILE"
