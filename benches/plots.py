#!/usr/bin/env python3
"""The figures of docs/BENCHMARKS.md, drawn from the same kept data as its tables
(benches/report.py --images DIR calls draw()).

  headline-ratios  CPU per request volfsd/virtiofsd per workload, defaults and
                   matched: median, min–max whiskers, 1.0 and the issue's targets
  latency          per workload, each configuration's latency percentiles (the
                   load generator keeps p50, p99, p99.9 and max, no histogram)
  held-nodes       RssAnon of the daemon's tree against the nodes it holds
                   (benches/scale.py's curve; its two points for older data)
  workloads        guest wall time and daemon CPU per guest workload and daemon
                   (read_workload_runs(): the one place that knows that format)

Deterministic: Agg, fixed sizes, DPI and the font matplotlib ships (DejaVu Sans),
and no "Software" stamp in the PNG; the same data and matplotlib give the same
bytes. Needs matplotlib (tests/install-deps.sh installs it).
"""
import glob
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

DPI = 100
STYLE = {
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.hashsalt": "volfsd",  # fixed ids, should an SVG ever be drawn
}
VOLFSD, VIRTIOFSD = "#1f5fa8", "#d9711c"
# Per configuration of benches/compare.sh: (colour, line style, marker, label).
CONFIGS = {
    "volfsd": (VOLFSD, "-", "o", "volfsd (defaults: O_PATH fds, sandbox, seccomp)"),
    "volfsd-open": (VOLFSD, "--", "s", "volfsd-open (no sandbox, no seccomp)"),
    "volfsd-fh": (VOLFSD, ":", "^", "volfsd-fh (--inode-file-handles prefer)"),
    "virtiofsd": (VIRTIOFSD, "-", "o", "virtiofsd (defaults: file handles, sandbox, seccomp)"),
    "virtiofsd-matched": (VIRTIOFSD, "--", "s", "virtiofsd-matched (O_PATH fds, no sandbox, no seccomp)"),
}
LABELS = {
    "randread4k": "4 KiB read", "randwrite4k": "4 KiB write", "seqread1m": "1 MiB read",
    "seqwrite1m": "1 MiB write", "lookup": "lookup", "getattr": "getattr",
    "metadata": "create-write-\nclose-unlink", "readdirplus": "READDIRPLUS",
    "qd1read4k": "QD 1\n4 KiB read", "qd1getattr": "QD 1\ngetattr",
}
# Issue 27's CPU-per-request targets, volfsd against virtiofsd: its defaults, and
# matched (no sandbox, no seccomp), "≤ 0.8× on every one" of the same six.
TARGET_DEFAULTS = {"randread4k": 0.7, "randwrite4k": 0.7, "metadata": 0.7,
                   "lookup": 0.5, "getattr": 0.5, "readdirplus": 0.5}
TARGET_MATCHED = {w: 0.8 for w in TARGET_DEFAULTS}


def med(v):
    return statistics.median(v)


def label(w):
    return LABELS.get(w, w)


def flat(w):
    return label(w).replace("-\n", "-").replace("\n", " ")


def log_axis(axis):
    """A log axis labelled 1, 2, 5 per decade in plain numbers (a narrow range
    otherwise gets no label, or 3×10^4-style ones)."""
    axis.axes.set_yscale("log") if axis.axis_name == "y" else axis.axes.set_xscale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def save(fig, path):
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)


# ---------------------------------------------------------------- (a) headline
def headline_ratios(lg, workloads, path):
    """lg: report.py's Series of the load generator's runs. Returns the alt text."""
    # (A, B, legend, colour, marker, targets): issue 27 sets its targets on volfsd's
    # defaults against each virtiofsd; the page's "matched" column has both unconfined.
    series = [("volfsd", "virtiofsd", "volfsd / virtiofsd, both defaults", VOLFSD, "o", TARGET_DEFAULTS),
              ("volfsd", "virtiofsd-matched", "volfsd (defaults) / virtiofsd-matched",
               VIRTIOFSD, "s", TARGET_MATCHED),
              ("volfsd-open", "virtiofsd-matched", "volfsd-open / virtiofsd-matched, both unconfined",
               "#6a9a3a", "D", {})]
    ws = [w for w in workloads if any(lg.ratios(a, b, w, "cpu") for a, b, *_ in series)]
    if not ws:
        return None
    fig, ax = plt.subplots(figsize=(11, 5.2))
    top = 1.2
    alt = {}
    for i, (a, b, what, colour, marker, targets) in enumerate(series):
        dx = (i - 1) * 0.27
        for j, w in enumerate(ws):
            r = lg.ratios(a, b, w, "cpu")
            if not r:
                continue
            m = med(r)
            top = max(top, max(r) + 0.12)
            ax.errorbar(j + dx, m, yerr=[[m - min(r)], [max(r) - m]], fmt=marker, color=colour,
                        ms=5, capsize=2.5, lw=1.1)
            ax.annotate(f"{m:.2f}", (j + dx, max(r)), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=6.5, color=colour, zorder=5,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3, "alpha": 0.8})
            if w in targets:
                ax.hlines(targets[w], j + dx - 0.12, j + dx + 0.12, colors=colour, lw=2.5, alpha=0.6, zorder=6)
            alt.setdefault(w, []).append(f"{m:.2f}×")
    ax.axhline(1.0, color="black", lw=1)
    for t in (0.5, 0.7, 0.8):
        ax.axhline(t, color="grey", lw=0.7, ls=":")
    ax.set_yticks([0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8] + [1.0 + 0.2 * k for k in range(int((top - 1.0) / 0.2) + 1)])
    ax.set_xticks(range(len(ws)), [label(w) for w in ws])
    ax.set_xlim(-0.6, len(ws) - 0.4)
    ax.set_ylim(0, top)
    ax.set_ylabel("CPU per request, A / B (below 1.0: volfsd costs less)")
    ax.set_title("Daemon CPU time per request, volfsd against virtiofsd (load generator, 1 queue; "
                 "median of the per-repetition ratios, whiskers min–max)")
    handles = [plt.Line2D([], [], color=c, marker=mk, ls="none", ms=5, label=what)
               for _, _, what, c, mk, _ in series]
    handles.append(plt.Line2D([], [], color="grey", lw=2.5, alpha=0.6,
                              label="issue 27's target for the ratio of that colour (dotted: 0.5, 0.7, 0.8)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.tight_layout()
    save(fig, path)
    return ("Headline: CPU per request per workload, volfsd/virtiofsd (defaults), volfsd/virtiofsd-matched "
            "and volfsd-open/virtiofsd-matched, medians with min–max whiskers, a line at 1.0 and issue "
            "27's targets marked: " + "; ".join(f"{flat(w)} " + ", ".join(alt[w]) for w in ws))


# ---------------------------------------------------------------- (b) latency
PERCENTILES = [("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9"), ("max_us", "max")]


def load_latency(data):
    """{config: {workload: {percentile key: [value per repetition]}}} from the load
    generator's JSON (loadgen/CONFIG-repN.json)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(data, "loadgen", "*-rep*.json"))):
        cfg = os.path.basename(path).rsplit("-rep", 1)[0]
        with open(path) as f:
            for r in json.load(f)["results"]:
                lat = out.setdefault(cfg, {}).setdefault(r["workload"], {})
                for k, _ in PERCENTILES:
                    if k in r["latency"]:
                        lat.setdefault(k, []).append(r["latency"][k])
    return out


def latency(data, configs, workloads, path):
    lat = load_latency(data)
    ws = [w for w in workloads if any(w in lat.get(c, {}) for c in configs)]
    if not ws:
        return None
    cols = 5
    rows = (len(ws) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(15, 3.2 * rows + 0.8), squeeze=False)
    xs = range(len(PERCENTILES))
    for ax, w in zip(axes.flat, ws):
        for c in configs:
            v = lat.get(c, {}).get(w)
            if not v:
                continue
            colour, ls, marker, _ = CONFIGS[c]
            keys = [k for k, _ in PERCENTILES]
            mid = [med(v[k]) for k in keys]
            ax.plot(xs, mid, color=colour, ls=ls, marker=marker, ms=3.5, lw=1.2)
            ax.fill_between(xs, [min(v[k]) for k in keys], [max(v[k]) for k in keys], color=colour,
                            alpha=0.12, lw=0)
        log_axis(ax.yaxis)
        ax.set_xticks(list(xs), [p for _, p in PERCENTILES])
        ax.set_title(flat(w) + ("" if w.startswith("qd1") else " (QD 32)"))
    for ax in list(axes.flat)[len(ws):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("latency per request (µs, log)")
    handles = [plt.Line2D([], [], color=CONFIGS[c][0], ls=CONFIGS[c][1], marker=CONFIGS[c][2], ms=4,
                          label=CONFIGS[c][3]) for c in configs if c in lat]
    fig.suptitle("Latency percentiles per workload (load generator; line: median of the repetitions, "
                 "band: min–max)", y=0.995, fontsize=10)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.96), ncol=len(handles),
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.935))
    save(fig, path)
    qd32 = [w for w in ws if not w.startswith("qd1")]
    text = "; ".join(f"{flat(w)} " + " against ".join(
        f"{med(lat[c][w]['p50_us']):.0f}" for c in ("volfsd", "virtiofsd") if w in lat.get(c, {}))
        for w in ws)
    return ("Latency percentiles (p50, p99, p99.9, max; µs, log scale) per workload for each "
            f"configuration, {len(qd32)} workloads at QD 32 and {len(ws) - len(qd32)} at QD 1. "
            "p50 µs, volfsd against virtiofsd: " + text)


# ---------------------------------------------------------------- (c) held nodes
def held_nodes(scale, path):
    """scale: benches/scale.py's JSON."""
    names = [n for n in CONFIGS if "inodes" in scale.get(n, {})]
    if not names:
        return None
    fig, ax = plt.subplots(figsize=(9, 5))
    alt = []
    for n in names:
        h = scale[n]["inodes"]
        colour, ls, marker, lab = CONFIGS[n]
        if h.get("curve"):
            pts = [(p["inodes"], p["rss_anon_kib"] / 1024) for p in h["curve"]]
            ax.plot(*zip(*pts), color=colour, ls=ls, marker=marker, ms=4, lw=1.4, label=lab)
        else:
            # Older data: only the two samples, at INIT and holding.
            pts = [(0, h["before"]["rss_anon_kib"] / 1024), (h["held"], h["holding"]["rss_anon_kib"] / 1024)]
            ax.plot(*zip(*pts), color=colour, ls="none", marker=marker, ms=6, label=lab + " (2 samples)")
        x, y = pts[-1]
        if h.get("stopped_by_errno"):
            ax.annotate(f"out of fds at {h['held']:,}\n(errno {h['stopped_by_errno']})", (x, y),
                        textcoords="offset points", xytext=(6, 4 if "virtio" in n else -22),
                        fontsize=7, color=colour)
        alt.append(f"{n} {y:.1f} MiB at {h['held']:,}")
    ax.set_xscale("symlog", linthresh=100, linscale=0.4)
    ax.set_xlim(-12, None)  # the samples at 0 held whole, off the axis
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    log_axis(ax.yaxis)
    ax.set_xlabel("nodes held by the frontend (looked up, never forgotten; log above 100)")
    ax.set_ylabel("RssAnon of the daemon's process tree (MiB, log)")
    ax.set_title("Held nodes against memory (benches/scale.py, QD 1 lookups of empty files)")
    ax.legend(loc="upper left", frameon=False)
    fig.tight_layout()
    save(fig, path)
    return "Held nodes against memory: RssAnon of each daemon's tree as the nodes it holds grow: " + \
        "; ".join(alt)


# ---------------------------------------------------------------- (d) workloads
def read_workload_runs(d):
    """The guest workloads' kept runs (benches/workloads.sh): ([workload names in
    order], {side: {workload: {"guest_wall_s": [per pair], "daemon_cpu_s": [per
    pair]}}}). The one place that knows their format: DIR/runs/pairN-SIDE.json =
    {"pair", "side", "workloads": {name: {"wall_s", "daemon_cpu_s", ...}}}. None when
    DIR or its runs are missing."""
    if not d or not os.path.isdir(os.path.join(d, "runs")):
        return None
    order, out = [], {}
    for path in sorted(glob.glob(os.path.join(d, "runs", "pair*-*.json"))):
        with open(path) as f:
            doc = json.load(f)
        for name, w in doc.get("workloads", {}).items():
            if name not in order:
                order.append(name)
            per = out.setdefault(doc["side"], {}).setdefault(name, {"guest_wall_s": [], "daemon_cpu_s": []})
            per["guest_wall_s"].append(w["wall_s"])
            per["daemon_cpu_s"].append(w["daemon_cpu_s"])
    return (order, out) if out else None


def workloads(d, path):
    got = read_workload_runs(d)
    if not got:
        return None
    order, runs = got
    daemons = [x for x in ("volfsd", "virtiofsd") if x in runs] + sorted(set(runs) - {"volfsd", "virtiofsd"})
    colours = {"volfsd": VOLFSD, "virtiofsd": VIRTIOFSD}
    panels = [("guest_wall_s", "the guest's wall time (s)"), ("daemon_cpu_s", "the daemon's CPU time (s)")]
    fig, axes = plt.subplots(2, 1, figsize=(max(7, 1.3 * len(order) + 2), 7))
    width = 0.8 / len(daemons)
    for ax, (k, what) in zip(axes, panels):
        top = 0
        for i, dm in enumerate(daemons):
            for j, w in enumerate(order):
                v = runs[dm].get(w, {}).get(k)
                if not v:
                    continue
                m = med(v)
                top = max(top, max(v))
                x = j + (i - (len(daemons) - 1) / 2) * width
                ax.bar(x, m, width * 0.9, color=colours.get(dm, "grey"), alpha=0.85,
                       label=dm if j == 0 else None)
                ax.errorbar(x, m, yerr=[[m - min(v)], [max(v) - m]], fmt="none", ecolor="black",
                            capsize=2, lw=0.8)
                ax.annotate(f"{m:.3g}", (x, max(v)), textcoords="offset points", xytext=(0, 2),
                            ha="center", fontsize=7)
        # volfsd/virtiofsd of the medians, above each workload
        for j, w in enumerate(order):
            a, b = (runs.get(x, {}).get(w, {}).get(k) for x in ("volfsd", "virtiofsd"))
            if a and b and med(b):
                ax.annotate(f"{med(a) / med(b):.2f}×", (j, top * 1.1), ha="center", fontsize=8,
                            fontweight="bold")
        ax.set_ylim(0, top * 1.2 if top else 1)
        ax.set_xticks(range(len(order)), order)
        ax.set_ylabel(what)
        ax.grid(axis="x", visible=False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(daemons), frameon=False)
    axes[0].set_title("Guest workloads on one share: the guest's wall time and the daemon's own CPU "
                      "(median of the pairs, whiskers min–max; bold: volfsd / virtiofsd)")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save(fig, path)
    alt = []
    for w in order:
        meds = {dm: (med(runs[dm][w]["guest_wall_s"]), med(runs[dm][w]["daemon_cpu_s"]))
                for dm in daemons if w in runs[dm]}
        alt.append(f"{w} " + ", ".join(f"{dm} {a:.3g} s wall and {b:.3g} s CPU" for dm, (a, b) in meds.items()))
    return ("Guest workloads: the guest's wall time and the daemon's CPU per workload and daemon, "
            "median seconds: " + "; ".join(alt))


# ---------------------------------------------------------------- all
FILES = {"headline": "bench-headline-ratios.png", "latency": "bench-latency.png",
         "held-nodes": "bench-held-nodes.png", "workloads": "bench-workloads.png"}


def draw(out_dir, data=None, lg=None, workloads_order=(), configs=(), scale=None, workloads_dir=None):
    """Draws every figure the data allows into out_dir: {key: (path, alt text)}."""
    plt.rcParams.update(plt.rcParamsDefault)
    plt.rcParams.update(STYLE)
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    jobs = {
        "headline": lambda p: headline_ratios(lg, workloads_order, p) if lg and lg.runs else None,
        "latency": lambda p: latency(data, configs, workloads_order, p) if data else None,
        "held-nodes": lambda p: held_nodes(scale, p) if scale else None,
        "workloads": lambda p: workloads(workloads_dir, p),
    }
    for key, job in jobs.items():
        path = os.path.join(out_dir, FILES[key])
        alt = job(path)
        if alt:
            out[key] = (path, alt)
    return out
