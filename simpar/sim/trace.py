"""Chrome trace JSON (loadable in Perfetto / chrome://tracing) and a timeline PNG of a
simulated step."""

from __future__ import annotations

import json

from simpar.files import atomic_write, write_text

STREAMS = ("compute", "comm-pp", "comm-dp")


def chrome_trace(events: list, title: str) -> dict:
    """One process per pipeline rank, one thread per stream; times in microseconds."""
    out = []
    for st in sorted({e[2] for e in events}):
        out.append({"name": "process_name", "ph": "M", "ts": 0, "pid": st, "tid": 0,
                    "args": {"name": f"pipeline rank {st}"}})
        for tid, stream in enumerate(STREAMS):
            out.append({
                "name": "thread_name", "ph": "M", "ts": 0, "pid": st, "tid": tid,
                "args": {"name": stream}
            })
    for name, stream, st, start, dur in events:
        out.append({
            "name": name, "cat": stream, "ph": "X", "ts": start * 1e6, "dur": dur * 1e6, "pid": st,
            "tid": STREAMS.index(stream)
        })
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"title": title}}


def write_trace(events: list, title: str, path: str) -> None:
    write_text(path, json.dumps(chrome_trace(events, title)), "--trace")


def write_timeline(events: list, title: str, path: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    stages = sorted({e[2] for e in events})
    colours = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green", "o": "tab:purple"}
    fig = Figure(figsize=(14, 1.0 + 0.5 * len(stages) * len(STREAMS)))
    ax = fig.subplots()
    labels = []
    for row, (st, stream) in enumerate((st, s) for st in stages for s in STREAMS):
        labels.append(f"rank {st} {stream}")
        bars = [(e[3], e[4]) for e in events if e[2] == st and e[1] == stream]
        cols = [colours.get(e[0][0], "tab:gray") if stream == "compute" else "tab:red"
                for e in events if e[2] == st and e[1] == stream]
        if bars:
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=cols)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(
        f"{title}  (blue forward, orange backward, green weight gradient, red communication)")
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"),
                 "--timeline")
