#!/usr/bin/env python3
"""The section "Under cloud-hypervisor: snapshot, restore, migration" of
docs/BENCHMARKS.md, from a vm-tests/run-ch-compare.sh run: the snapshot, restore
and live-migration times of volfsd and virtiofsd 1.14 under cloud-hypervisor,
nested (an L1 QEMU TCG guest runs cloud-hypervisor with kvm-amd), so only their
ratios mean something, and the scenarios' outcomes side by side (summary.md).

report.py calls section(P, DIR, readings) for --ch-compare DIR.
"""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _text(d, name):
    try:
        with open(os.path.join(d, name)) as f:
            return f.read()
    except OSError:
        return ""


# Each figure: (label, side's scenario dir, regex on its timings.txt giving seconds,
# or milliseconds with scale 0.001).
FIGURES = [
    ("snapshot (`ch-remote snapshot` of the paused VM)", "snapshot", r"^snapshot src: ([\d.]+) s", 1),
    ("restore (`--restore` to a paused VM), on the share", "snapshot", r"^restore restored: ([\d.]+) s to a paused VM", 1),
    ("restore and resume, on the share", "snapshot", r"^restore restored: .*resumed after ([\d.]+) s", 1),
    ("live migration over TCP: cloud-hypervisor's downtime", "live",
     r"^migration a1 -> b1 \(tcp\):.*downtime of (\d+)ms", 0.001),
    ("live migration over TCP: send-migration to the destination running", "live",
     r"^migration a1 -> b1 \(tcp\): b1 running ([\d.]+) s", 1),
    ("live migration, local=on (first): cloud-hypervisor's downtime", "live",
     r"^migration b1 -> a2 \(local\):.*downtime of (\d+)ms", 0.001),
    ("live migration, local=on (back): cloud-hypervisor's downtime", "live",
     r"^migration a2 -> b2 \(local\):.*downtime of (\d+)ms", 0.001),
]


def figures(d):
    """label -> (volfsd seconds or None, virtiofsd seconds or None)"""
    got = {}
    for label, scen, rx, scale in FIGURES:
        vals = []
        for side, prefix in (("volfsd", ""), ("virtiofsd", "vfs-")):
            m = re.search(rx, _text(d, f"{side}/logs/{prefix}{scen}/timings.txt"), re.M)
            vals.append(float(m.group(1)) * scale if m else None)
        got[label] = tuple(vals)
    return got


def section(P, d, readings):
    rel = os.path.relpath(d, REPO)
    env = dict(l.split(": ", 1) for l in _text(d, "env.txt").splitlines() if ": " in l)
    P("## Under cloud-hypervisor: snapshot, restore, live migration (nested)\n")
    P(f"`{_text(d, 'cmd.txt').strip()}`, raw output in [`{rel}`](../{rel}) (each side's `run.txt`, "
      f"its scenarios' logs and `timings.txt`), commit `{env.get('commit', '?')[:12]}`, "
      f"{env.get('date', '?')}; {env.get('cloud-hypervisor', 'cloud-hypervisor v53.0')}. "
      "cloud-hypervisor runs nested: an L1 QEMU TCG guest (1 vCPU, `-cpu max`, kvm-amd) runs the "
      "daemon and cloud-hypervisor, which boots the test guest (512 MiB, 1 vCPU) with its share "
      "(vm-tests/README.md, cloud-hypervisor). Every guest instruction and every request crosses "
      "two levels of emulation, on 2 host cores shared with other work, and each figure is one "
      "run: only the ratio of the two daemons says anything, and a ratio near 1 says the daemon "
      "is not what the time is spent on. The daemon's own part is in its log: volfsd's state "
      "save and load take milliseconds at the few nodes these guests hold "
      "([device state](#device-state-save-and-load) has it at scale). The guest works throughout "
      "each move (run-ch-migration.sh: an appending fd, a reading fd, a directory half read, "
      "locks, a shared map, fio with verify); virtiofsd gets `--allow-mmap` and its locks stay in "
      "the guest's kernel.\n")
    if env.get("volfsd side"):
        P(f"How the two sides ran: {env['volfsd side']}.\n")
    P("What differs in the moves: virtiofsd locks a pid file beside its socket (`SOCKET.pid`), "
      "so a second virtiofsd on the VM's socket path (a restore's or a migration's destination "
      "on the same host) cannot start while the source's runs. Its snapshot scenario therefore "
      "stops the source's VMM and virtiofsd before the restore (the guest's locks are free in "
      "between; volfsd's restored daemon starts beside the source's and takes its lock files "
      "over), and its live scenario ends at the first migration, whose destination virtiofsd "
      "exits at its start (`Error creating pid file`; virtiofsd has no `--keep-serving` for "
      "`local=on` either). virtiofsd offers one request queue: cloud-hypervisor refuses "
      "`num_queues=2` with it (`CreateVirtioFs(BadQueueNum)`), so its 2-queue basic run never "
      "boots.\n")
    P("| what (seconds) | volfsd | virtiofsd 1.14 | volfsd / virtiofsd |")
    P("|---|---:|---:|---:|")
    for label, (v, o) in figures(d).items():
        cell = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
        ratio = f"{v / o:.2f}×" if v is not None and o else "—"
        P(f"| {label} | {cell(v)} | {cell(o)} | {ratio} |")
    P("")
    P("— : no figure (that side's move did not happen; its outcome is in the table below).\n")
    summary = _text(d, "summary.md")
    table = summary.split("\n\n", 1)[0] if summary else ""
    P("What each guest saw, scenario by scenario (`summary.md`):\n")
    P(table if table else "(no summary.md: the run did not finish)")
    P("")
    fig = figures(d)
    v, o = fig[FIGURES[0][0]]
    if v is not None:
        readings.append(
            f"Under cloud-hypervisor (nested), a snapshot with volfsd took {v:.1f} s"
            + (f" and {o:.1f} s with virtiofsd" if o is not None else " (virtiofsd: no figure)")
            + "; the outcomes of each move, side by side, are in the cloud-hypervisor section.")
