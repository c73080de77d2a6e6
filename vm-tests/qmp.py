#!/usr/bin/env python3
"""Minimal QMP client (standard library only), for vm-tests/run-migration.sh.

    qmp.py SOCKET COMMAND ['{"json": "arguments"}']   run one command, print the return
    qmp.py SOCKET wait-migration [TIMEOUT]           poll query-migrate until completed/failed
    qmp.py SOCKET wait-status STATUS[,STATUS] [TIMEOUT]  poll query-status until it reads STATUS

Every call opens the socket, reads the greeting, sends qmp_capabilities, then
its command(s). Events that arrive meanwhile are printed to stderr with their
timestamps. Exit status 1 on a QMP error, a failed migration, a timeout, or
when QEMU closes the socket (it exits, e.g. after a failed incoming migration).
"""
import json
import socket
import sys
import time


class QMP:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for _ in range(100):
            try:
                self.s.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.1)
        else:
            self.s.connect(path)
        self.f = self.s.makefile("rwb", buffering=0)
        self._read()  # greeting
        self.cmd("qmp_capabilities")

    def _read(self):
        while True:
            line = self.f.readline()
            if not line:
                raise EOFError("QMP socket closed")
            msg = json.loads(line)
            if "event" in msg:
                ts = msg.get("timestamp", {})
                sys.stderr.write("event %s.%06d %s %s\n" % (ts.get("seconds", 0), ts.get("microseconds", 0),
                                                            msg["event"], json.dumps(msg.get("data", {}))))
                continue
            return msg

    def cmd(self, name, args=None):
        req = {"execute": name}
        if args:
            req["arguments"] = args
        self.f.write((json.dumps(req) + "\n").encode())
        resp = self._read()
        if "error" in resp:
            raise RuntimeError("%s: %s" % (name, resp["error"].get("desc", resp["error"])))
        return resp.get("return")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    what = sys.argv[2]
    try:
        q = QMP(sys.argv[1])
        if what == "wait-migration":
            timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 600
            t0 = time.monotonic()
            last = None
            while True:
                r = q.cmd("query-migrate")
                st = r.get("status")
                if st != last:
                    sys.stderr.write("+%.3fs migration status %s\n" % (time.monotonic() - t0, st))
                    last = st
                if st in ("completed", "failed", "cancelled"):
                    print(json.dumps(r, indent=1))
                    sys.exit(0 if st == "completed" else 1)
                if time.monotonic() - t0 > timeout:
                    print(json.dumps(r, indent=1))
                    sys.exit("timeout waiting for migration")
                time.sleep(0.1)
        elif what == "wait-status":
            want = sys.argv[3].split(",")
            timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 600
            t0 = time.monotonic()
            while True:
                r = q.cmd("query-status")
                if r.get("status") in want:
                    print(json.dumps(r))
                    return
                if time.monotonic() - t0 > timeout:
                    sys.exit("timeout: status is %s" % r.get("status"))
                time.sleep(0.1)
        else:
            args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
            print(json.dumps(q.cmd(what, args), indent=1))
    except RuntimeError as e:
        sys.stderr.write("QMP error: %s\n" % e)
        sys.exit(1)
    except (EOFError, OSError) as e:
        sys.stderr.write("QMP: %s: %s (QEMU gone?)\n" % (what, e))
        sys.exit(1)


if __name__ == "__main__":
    main()
