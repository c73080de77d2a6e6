#!/usr/bin/env bash
# The Debian package, end to end: builds it (packaging/build-deb.sh), removes any
# installed volfsd, installs it with dpkg -i, and checks the installed files with
# the commands a user or a launcher would run:
#   - dpkg -L lists every asset, and each is on disk
#   - /usr/bin/volfsd --version matches the package version; --print-capabilities
#     is JSON of type fs
#   - the man page renders (man -l) and shows every flag of --help and each
#     `volfsd ctl` command; man finds it by name
#   - the bash completion loads and completes; the zsh and fish files are volfsd's
#   - the QEMU vhost-user descriptor is valid JSON of type fs naming an executable
#     that answers --print-capabilities (what libvirt does)
#   - systemd-analyze verify accepts the installed units
#   - socket activation: systemd-socket-activate listens on the socket unit's path
#     and runs the activated service's ExecStart (--fd=3); the load generator
#     connects, completes vhost-user setup and FUSE requests, and volfsd exits 0
#   - volfsd@.service's ExecStart, run as systemd would expand it, serves its socket
#   - vm-tests/demo.sh --daemon /usr/bin/volfsd boots a guest on the installed binary
#   - dpkg -r removes every file
# Prints "ok"/"FAIL" per check and ends with "N passed, N failed"; exits 1 if any
# check failed. Needs root. Cleans up (dpkg -r, its processes, temp files) on exit.
#
# Usage: tests/package.sh [--no-demo]   (--no-demo skips the VM demo)
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
RUN_DEMO=1
[[ ${1:-} == --no-demo ]] && RUN_DEMO=0

BIN=/usr/bin/volfsd
LOADGEN=$REPO/target/release/volfsd-loadgen
NAME=pkgtest-$$
# What the package must install (Cargo.toml's [package.metadata.deb] assets, and the
# copyright file cargo-deb adds).
ASSETS=(
	/usr/bin/volfsd
	/usr/share/man/man1/volfsd.1.gz
	/usr/share/bash-completion/completions/volfsd
	/usr/share/zsh/vendor-completions/_volfsd
	/usr/share/fish/vendor_completions.d/volfsd.fish
	/usr/share/qemu/vhost-user/40-volfsd.json
	/lib/systemd/system/volfsd@.service
	/lib/systemd/system/volfsd-activated@.socket
	/lib/systemd/system/volfsd-activated@.service
	/usr/share/doc/volfsd/README.md
	/usr/share/doc/volfsd/README.Debian
	/usr/share/doc/volfsd/control-api.md
	/usr/share/doc/volfsd/SECURITY.md
	/usr/share/doc/volfsd/examples/example.env
	/usr/share/doc/volfsd/copyright
)

passed=0
failed=0
pass() { echo "ok   $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
info() { echo "     $*"; }
check() { # description command... : ok if the command succeeds
	local what=$1
	shift
	if "$@"; then pass "$what"; else fail "$what"; fi
}
is_fs_json() { jq -e '.type == "fs"' >/dev/null 2>&1; }
finish() {
	echo "$passed passed, $failed failed"
	[[ $failed == 0 ]]
	exit
}

WORK=$(mktemp -d /tmp/volfsd-package.XXXXXX)
PIDS=()
MADE_RUN_DIR=0
cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
	done
	if dpkg-query -W -f='${Status}' volfsd 2>/dev/null | grep -q "install ok installed"; then
		dpkg -r volfsd >/dev/null 2>&1 || echo "package: dpkg -r volfsd failed" >&2
	fi
	rm -f "/run/volfsd/$NAME.sock"
	[[ $MADE_RUN_DIR == 0 ]] || rmdir /run/volfsd 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT

if [[ $(id -u) != 0 ]]; then
	fail "tests/package.sh needs root (dpkg -i)"
	finish
fi

# --- build and install -------------------------------------------------------

echo "package: building (packaging/build-deb.sh)"
start=$SECONDS
DEB=$(bash packaging/build-deb.sh 2>"$WORK/build.log" | tail -n 1)
if [[ -n $DEB && -f $DEB ]]; then
	pass "build-deb.sh built $(basename "$DEB") in $((SECONDS - start)) s"
else
	tail -n 30 "$WORK/build.log"
	fail "build-deb.sh built no package"
	finish
fi
grep -E '^build-deb: cargo-deb installed' "$WORK/build.log" | sed 's/^/     /'

if dpkg-query -W -f='${Status}' volfsd 2>/dev/null | grep -q "install ok installed"; then
	info "removing the installed volfsd $(dpkg-query -W -f='${Version}' volfsd)"
	dpkg -r volfsd >/dev/null || { fail "dpkg -r of the previous volfsd"; finish; }
fi
if dpkg -i "$DEB" >"$WORK/dpkg.log" 2>&1; then
	pass "dpkg -i $(basename "$DEB")"
else
	cat "$WORK/dpkg.log"
	fail "dpkg -i $(basename "$DEB")"
	finish
fi

# --- files -------------------------------------------------------------------

dpkg -L volfsd >"$WORK/list"
missing=()
for f in "${ASSETS[@]}"; do
	grep -qxF "$f" "$WORK/list" && [[ -f $f ]] || missing+=("$f")
done
if [[ ${#missing[@]} == 0 ]]; then
	pass "dpkg -L volfsd lists all ${#ASSETS[@]} assets, each on disk"
else
	fail "dpkg -L volfsd: missing ${missing[*]}"
fi
check "/usr/bin/volfsd is executable, owned by root, mode 755" \
	test "$(stat -c '%U %a' "$BIN" 2>/dev/null)" = "root 755"
depends=$(dpkg-query -W -f='${Depends}' volfsd)
check "Depends computed by dpkg-shlibdeps: $depends" grep -q 'libc6 (>= ' <<<"$depends"

# --- the binary --------------------------------------------------------------

pkgver=$(dpkg-query -W -f='${Version}' volfsd)
version=$("$BIN" --version 2>&1)
check "volfsd --version: '$version' (package $pkgver)" test "$version" = "volfsd ${pkgver%-*}"
caps=$("$BIN" --print-capabilities 2>&1)
check "volfsd --print-capabilities is JSON of type fs: $(jq -c . <<<"$caps" 2>/dev/null | head -c 200)" \
	is_fs_json <<<"$caps"

# --- man page ----------------------------------------------------------------

page=$(MANWIDTH=250 man -l /usr/share/man/man1/volfsd.1.gz 2>"$WORK/man.err")
if [[ -n $page && ! -s $WORK/man.err ]]; then
	pass "man -l renders volfsd.1.gz without warnings ($(wc -l <<<"$page") lines)"
else
	cat "$WORK/man.err"
	fail "man -l volfsd.1.gz"
fi
flags=$("$BIN" --help | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
absent=()
for f in $flags; do
	grep -qF -- "$f" <<<"$page" || absent+=("$f")
done
if [[ -n $flags && ${#absent[@]} == 0 ]]; then
	pass "the man page shows all $(wc -w <<<"$flags") flags of volfsd --help"
else
	fail "the man page lacks ${absent[*]:-every flag}"
fi
ctl_cmds=$("$BIN" ctl --help | awk '/^Commands:/ { on = 1; next } on && NF == 0 { on = 0 } on && $1 != "help" { print $1 }')
absent=()
for c in $ctl_cmds; do
	grep -qF "volfsd ctl $c" <<<"$page" || absent+=("$c")
done
if [[ -n $ctl_cmds && ${#absent[@]} == 0 ]] && grep -q '^CONTROL CLIENT' <<<"$page"; then
	pass "the man page's CONTROL CLIENT section has volfsd ctl $(echo $ctl_cmds | tr ' ' '|')"
else
	fail "the man page lacks volfsd ctl ${absent[*]:-(no CONTROL CLIENT section or no ctl commands)}"
fi
check "man -w volfsd finds the installed page" \
	test "$(man -w volfsd 2>/dev/null)" = /usr/share/man/man1/volfsd.1.gz

# --- completions -------------------------------------------------------------

spec=$(bash -c 'source /usr/share/bash-completion/completions/volfsd && complete -p volfsd' 2>&1)
check "bash completion loads: $spec" grep -q -- '-F _volfsd volfsd$' <<<"$spec"
# shellcheck disable=SC2016 # expanded by the inner bash
words=$(bash -c 'source /usr/share/bash-completion/completions/volfsd
	COMP_WORDS=(volfsd ctl ""); COMP_CWORD=2; COMP_LINE="volfsd ctl "; COMP_POINT=${#COMP_LINE}
	_volfsd volfsd "" ctl; echo "${COMPREPLY[*]}"
	COMP_WORDS=(volfsd --shared); COMP_CWORD=1; COMP_LINE="volfsd --shared"; COMP_POINT=${#COMP_LINE}
	_volfsd volfsd --shared volfsd; echo "${COMPREPLY[*]}"' 2>&1)
check "bash completes 'volfsd ctl ' and 'volfsd --shared': $(tr '\n' '/' <<<"$words")" \
	grep -qzE 'attach detach limit list stats.*--shared-dir' <<<"$words"
check "zsh completion is #compdef volfsd" \
	test "$(head -n 1 /usr/share/zsh/vendor-completions/_volfsd)" = "#compdef volfsd"
if command -v zsh >/dev/null; then
	check "zsh -n accepts _volfsd" zsh -n /usr/share/zsh/vendor-completions/_volfsd
fi
check "fish completion completes volfsd --shared-dir" \
	grep -q -- '^complete -c volfsd .*-l shared-dir' /usr/share/fish/vendor_completions.d/volfsd.fish
if command -v fish >/dev/null; then
	check "fish -n accepts volfsd.fish" fish -n /usr/share/fish/vendor_completions.d/volfsd.fish
fi

# --- QEMU vhost-user descriptor ----------------------------------------------

desc=/usr/share/qemu/vhost-user/40-volfsd.json
dbin=$(jq -er 'select(.type == "fs" and (.description | type == "string")) | .binary' "$desc" 2>/dev/null)
if [[ -n $dbin && -f $dbin && -x $dbin ]]; then
	pass "$desc: type fs, binary $dbin exists and is executable"
else
	fail "$desc: not valid JSON of type fs with an executable binary (binary: '${dbin}')"
fi
check "the descriptor's binary answers --print-capabilities (type fs)" \
	is_fs_json < <("${dbin:-/nonexistent}" --print-capabilities 2>/dev/null)

# --- systemd units -----------------------------------------------------------

units=(/lib/systemd/system/volfsd@.service /lib/systemd/system/volfsd-activated@.socket
	/lib/systemd/system/volfsd-activated@.service)
if command -v systemd-analyze >/dev/null; then
	# Offline checks (no systemd needed as PID 1): syntax, the ExecStart binary,
	# Documentation=man:volfsd(1). Templates are checked as instance "i".
	if systemd-analyze verify "${units[@]}" >"$WORK/verify.log" 2>&1; then
		pass "systemd-analyze verify: ${units[*]##*/}"
	else
		sed 's/^/     /' "$WORK/verify.log"
		fail "systemd-analyze verify: ${units[*]##*/}"
	fi
else
	info "systemd-analyze not installed: units not verified"
fi

# ExecStart= of an installed unit, expanded as systemd would for instance $NAME with
# VOLFSD_SHARED_DIR=$2 and VOLFSD_ARGS=$3 (unquoted: split at whitespace).
exec_start() { # unit shared_dir args
	local line
	line=$(sed -n 's/^ExecStart=//p' "$1")
	line=${line//%i/$NAME}
	line=${line//'${VOLFSD_SHARED_DIR}'/$2}
	line=${line//'$VOLFSD_ARGS'/$3}
	echo "$line"
}
# The vhost-user socket of the instance, as the socket unit names it.
listen_path=$(sed -n 's/^ListenStream=//p' /lib/systemd/system/volfsd-activated@.socket)
listen_path=${listen_path//%i/$NAME}
[[ -d /run/volfsd ]] || { mkdir -p /run/volfsd && MADE_RUN_DIR=1; }

# Runs the load generator briefly against $1 (shared dir $2); returns its status.
load() { # socket shared_dir log
	timeout 60 "$LOADGEN" --socket "$1" --shared-dir "$2" --workload getattr,lookup \
		--ops 200 --files 20 --file-size 1M --quiet >"$3" 2>&1
}
# Waits up to 10 s for a socket to appear.
wait_socket() { local i; for i in $(seq 100); do [[ -S $1 ]] && return 0; sleep 0.1; done; return 1; }
# Waits up to 10 s for pid $1 to exit; its status is in $rc.
wait_exit() {
	local i
	for i in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$1" 2>/dev/null; then rc=timeout; else wait "$1"; rc=$?; fi
}

[[ -x $LOADGEN ]] || cargo build --release --locked -p volfsd-harness --bin volfsd-loadgen >/dev/null 2>&1

# Socket activation: the socket unit's path, the activated service's command line.
share=$WORK/activated
mkdir -p "$share"
cmd=$(exec_start /lib/systemd/system/volfsd-activated@.service "$share" "--log-level debug --num-request-queues 2")
info "systemd-socket-activate -l $listen_path $cmd"
# shellcheck disable=SC2086 # the unit's command line, split as systemd splits it
systemd-socket-activate -l "$listen_path" $cmd >"$WORK/activated.log" 2>&1 &
pid=$!
PIDS+=("$pid")
if wait_socket "$listen_path" && kill -0 "$pid" 2>/dev/null; then
	pass "systemd-socket-activate listens on $listen_path"
else
	cat "$WORK/activated.log"
	fail "systemd-socket-activate did not listen on $listen_path"
fi
if load "$listen_path" "$share" "$WORK/load-activated.log"; then
	pass "the load generator ran vhost-user setup and FUSE requests over the activated socket"
else
	sed 's/^/     /' "$WORK/load-activated.log"
	fail "the load generator over the activated socket"
fi
wait_exit "$pid"
if [[ $rc == 0 ]] && grep -q "^Execing $BIN " "$WORK/activated.log" &&
	grep -q "serving $share on fd 3" "$WORK/activated.log" &&
	grep -q "frontend disconnected, exiting" "$WORK/activated.log"; then
	pass "the activated volfsd served fd 3 and exited 0 when the frontend left"
else
	sed 's/^/     /' "$WORK/activated.log"
	fail "the activated volfsd (exit status $rc)"
fi

# The listening socket stays after volfsd exits (systemd would remove it at stop).
rm -f "$listen_path"

# volfsd@.service: its ExecStart as systemd runs it (/run/volfsd is the unit's
# RuntimeDirectory).
share=$WORK/instance
mkdir -p "$share"
sock=/run/volfsd/$NAME.sock
cmd=$(exec_start /lib/systemd/system/volfsd@.service "$share" "--num-request-queues 2")
info "$cmd"
# shellcheck disable=SC2086 # as above
$cmd >"$WORK/instance.log" 2>&1 &
pid=$!
PIDS+=("$pid")
if wait_socket "$sock" && load "$sock" "$share" "$WORK/load-instance.log"; then
	wait_exit "$pid"
else
	sed 's/^/     /' "$WORK/load-instance.log" 2>/dev/null
	rc=failed
fi
if [[ $rc == 0 ]]; then
	pass "volfsd@.service's ExecStart served $sock and exited 0"
else
	sed 's/^/     /' "$WORK/instance.log"
	fail "volfsd@.service's ExecStart ($rc)"
fi

# --- the demo, on the installed binary ---------------------------------------

if [[ $RUN_DEMO == 1 ]]; then
	echo "package: vm-tests/demo.sh --daemon $BIN"
	start=$SECONDS
	# Indented: the demo's own "N passed, N failed" must not end this script's output.
	bash vm-tests/demo.sh --daemon "$BIN" >"$WORK/demo.log" 2>&1
	rc=$?
	sed 's/^/     | /' "$WORK/demo.log"
	if [[ $rc == 0 ]] && grep -q 'Demo finished' "$WORK/demo.log" &&
		grep -q "through $(basename "$BIN")" "$WORK/demo.log" &&
		grep -q '^hello-from-guest.txt: .' "$WORK/demo.log"; then
		pass "vm-tests/demo.sh --daemon $BIN: the guest read and wrote the share ($((SECONDS - start)) s)"
	else
		fail "vm-tests/demo.sh --daemon $BIN (exit $rc)"
	fi
fi

# --- removal -----------------------------------------------------------------

if dpkg -r volfsd >"$WORK/dpkg-r.log" 2>&1; then
	left=()
	for f in "${ASSETS[@]}"; do [[ -e $f ]] && left+=("$f"); done
	if [[ ${#left[@]} == 0 ]]; then
		pass "dpkg -r volfsd removed every file"
	else
		fail "dpkg -r volfsd left ${left[*]}"
	fi
else
	cat "$WORK/dpkg-r.log"
	fail "dpkg -r volfsd"
fi

finish
