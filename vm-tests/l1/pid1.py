#!/usr/bin/python3
"""PID 1 of the L1 guest once its root is the host's (vm-tests/l1/init hands over).

    pid1.py OUT REPO

Runs `bash REPO/vm-tests/l1/stage2.sh OUT REPO`, reaps every process that ends
under it meanwhile (orphans are re-parented to PID 1: a daemon's serving process
whose keeper was killed must not linger as a zombie, or `kill -0` would call it
alive), then syncs and powers L1 off. The exit status of stage2.sh is written by
stage2.sh itself to OUT/l1/rc.
"""
import ctypes
import os
import subprocess
import sys


def main():
    out, repo = sys.argv[1], sys.argv[2]
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/root/.cargo/bin",
        "HOME": "/root",
        "TERM": "dumb",
        "LANG": "C.UTF-8",
    }
    console = open("/dev/console", "w")
    try:
        child = subprocess.Popen(["/bin/bash", os.path.join(repo, "vm-tests/l1/stage2.sh"), out, repo],
                                 env=env, stdin=subprocess.DEVNULL, stdout=console, stderr=console)
        while True:
            try:
                pid, _ = os.wait()
            except ChildProcessError:
                break
            if pid == child.pid:
                break
    except Exception as e:  # noqa: BLE001 - PID 1 must get to the power-off
        console.write("VMTEST-L1 FATAL pid1: %r\n" % (e,))
    console.write("VMTEST-L1 POWEROFF\n")
    console.flush()
    os.sync()
    # reboot(2) with LINUX_REBOOT_CMD_POWER_OFF: QEMU then exits (-no-reboot).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.reboot(0x4321FEDC)
    os._exit(1)


if __name__ == "__main__":
    main()
