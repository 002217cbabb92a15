"""Where a GPU is busy and where it waits, read from a torch profiler trace (Chrome trace JSON, ``.json`` or
``.json.gz``, as vLLM's ``--profiler-config`` torch profiler writes it).

The GPU's activity is the trace's kernel, memcpy and memset events (the ones CUPTI records on the device,
kernels replayed from CUDA graphs included). ``summarize`` gives the window they span, the time at least one
of them ran (their union: concurrent streams count once), the largest kernels by total time, and the idle
gaps between them, summed by the pair of kernels around each gap, so that a share of idle time can be put on
a place in the step (between two layers' kernels, between steps, around a side stream's join).

``steps`` cuts the events into engine steps at each launch of a kernel the caller names (one that runs once a
forward, first: the embedding's, for example): each step's cycle from that kernel to the next one's launch (the
forward, the sampling and the next step's input copies), the GPU's idle time in it and the kernel time. Decode
steps the GPU runs back to back idle a few percent of their cycle; a host that holds a step back shows as idle
time in the cycle before it. Also the share of a step a group of kernels takes (``CLI --step-start embedding``;
a substring: check that the step count matches the forwards traced)."""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
GAP_BINS_US = (2.0, 10.0, 100.0)   # gap sizes: < 2 us (launch to launch inside a graph), 2-10, 10-100, >= 100


def load_events(path: Path) -> list[dict]:
    """The GPU activity events of a Chrome trace file, as dicts of name, ts and dur (microseconds, floats; events
    of no duration left out: they mark no time on the GPU)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data if isinstance(data, list) else []
    out = []
    for e in events:
        if not (isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in GPU_CATS):
            continue
        try:
            ts, dur = float(e["ts"]), float(e["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        if dur > 0:
            out.append({"name": str(e.get("name", "?")), "ts": ts, "dur": dur})
    return out


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def _gaps(ev: list[dict]) -> tuple[list[tuple[float, str, str]], float]:
    """The idle gaps between time-sorted ``ev`` (size, the kernel whose end opens it, the one whose start closes it)
    and the end of the last to finish."""
    gaps: list[tuple[float, str, str]] = []
    cur_end, cur_name = float(ev[0]["ts"]), ev[0]["name"]
    for e in ev:
        ts, te = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if ts > cur_end:   # nothing on the GPU between cur_end and ts
            gaps.append((ts - cur_end, cur_name, e["name"]))
        if te >= cur_end:
            cur_end, cur_name = te, e["name"]
    return gaps, cur_end


def summarize(events: list[dict], top: int = 12) -> dict:
    """Busy share, largest kernels and idle gaps of ``events`` (``load_events``); ``{"events": 0}`` if none."""
    events = [e for e in events if float(e["dur"]) > 0]
    if not events:
        return {"events": 0}
    ev = sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"])))
    start = float(ev[0]["ts"])
    gaps, end = _gaps(ev)
    idle = sum(g for g, _, _ in gaps)
    busy = (end - start) - idle
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in ev:
        k = per_kernel[e["name"]]
        k[0] += 1
        k[1] += float(e["dur"])
    kernel_time = sum(t for _, t in per_kernel.values())
    kernels = [{"name": _short(n), "count": int(c), "total_us": t, "share": t / kernel_time}
               for n, (c, t) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:top]]
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for g, before, after in gaps:
        p = by_pair[(before, after)]
        p[0] += 1
        p[1] += g
    pairs = [{"before": _short(b, 60), "after": _short(a, 60), "count": int(c), "total_us": t,
              "share_of_idle": t / idle if idle > 0 else 0.0}
             for (b, a), (c, t) in sorted(by_pair.items(), key=lambda kv: -kv[1][1])[:top]]
    edges = (0.0, *GAP_BINS_US, float("inf"))
    bins = {f"{lo:g}-{hi:g} us": sum(g for g, _, _ in gaps if lo <= g < hi) for lo, hi in zip(edges, edges[1:])}
    return {"events": len(ev), "window_us": end - start, "busy_us": busy, "busy_share": busy / (end - start),
            "idle_us": idle, "gaps": len(gaps), "idle_by_gap_size_us": bins, "kernels": kernels,
            "idle_by_neighbours": pairs}


def format_summary(s: dict) -> str:
    """A few lines for a terminal: the busy share, the largest kernels, where the idle time sits."""
    if not s.get("events"):
        return "no GPU kernel, memcpy or memset events in the trace (a CPU-only server, or the profiler saw no step)"
    lines = [f"GPU busy {100 * s['busy_share']:.1f}% of {s['window_us'] / 1e3:.2f} ms ({s['events']} events, "
             f"{s['gaps']} idle gaps, {s['idle_us'] / 1e3:.2f} ms idle; by gap size: "
             + ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in s["idle_by_gap_size_us"].items()) + ")",
             "largest kernels (count, total ms, share of kernel time):"]
    lines += [f"  {k['count']:6d} {k['total_us'] / 1e3:9.2f} {100 * k['share']:5.1f}%  {k['name']}" for k in s["kernels"]]
    lines.append("idle time by the kernels around it (count, total ms, share of idle): before -> after")
    lines += [f"  {p['count']:6d} {p['total_us'] / 1e3:9.2f} {100 * p['share_of_idle']:5.1f}%  {p['before']} -> "
              f"{p['after']}" for p in s["idle_by_neighbours"]]
    return "\n".join(lines)


def steps(events: list[dict], start: str) -> list[dict]:
    """The engine steps of ``events``: one per launch of a kernel whose name contains ``start`` (a substring:
    check that the step count is the number of forwards traced). A step's cycle runs from that launch to the
    next one (the last step's to its last kernel's end), so it holds the step's forward, its sampling and the
    next step's input copies; per step: the cycle, the GPU's idle time in it (the cycle less the union of the
    GPU's activity: concurrent streams count once), the summed kernel time (streams each counted), each kernel's
    and the step's event count. Events before the first such launch belong to no step."""
    ev = sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"])))
    firsts = [i for i, e in enumerate(ev) if start in e["name"]]
    out = []
    for n, (a, b) in enumerate(zip(firsts, firsts[1:] + [len(ev)])):
        part = ev[a:b]
        gaps, end = _gaps(part)
        t0 = float(part[0]["ts"])
        t1 = float(ev[b]["ts"]) if b < len(ev) else end
        per: dict[str, float] = defaultdict(float)
        for e in part:
            per[e["name"]] += float(e["dur"])
        # every gap lies before the next step's first launch; then the GPU idles from the last end to it, if before
        out.append({"step": n, "cycle_us": t1 - t0, "idle_us": sum(g for g, _, _ in gaps) + max(0.0, t1 - end),
                    "kernel_us": sum(per.values()), "events": len(part), "last": b == len(ev), "by_kernel_us": dict(per)})
    return out


def format_steps(st: list[dict], top: int = 8, before: int = 0) -> str:
    """Per step: cycle, GPU idle in it, kernel time; then each kernel's mean time a step over all the steps (prefill
    and partial ones included). ``before``: the events that came before the first step."""
    if not st:
        return "no step: no kernel's name contains the --step-start text"
    lines = [f"{len(st)} steps (cycle = one step-start kernel to the next, ms; GPU idle in it, us; kernel time, ms)"
             + (f"; {before} events before the first step left out" if before else "") + ":"]
    lines += [f"  {s['step']:3d} {s['cycle_us'] / 1e3:9.2f} {s['idle_us']:10.1f} {s['kernel_us'] / 1e3:9.2f}"
              + ("  (last: to its last kernel's end)" if s["last"] else "") for s in st]
    per: dict[str, float] = defaultdict(float)
    for s in st:
        for k, v in s["by_kernel_us"].items():
            per[k] += v / len(st)
    lines.append("kernel time a step, mean over the steps (us):")
    lines += [f"  {v:10.1f}  {_short(k)}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="GPU busy share, largest kernels and idle gaps of torch profiler traces")
    p.add_argument("traces", nargs="+", type=Path, help="Chrome trace files (.json or .json.gz)")
    p.add_argument("--step-start", default="", help="also cut the trace into engine steps at each kernel whose name "
                   "contains this text (one that runs first in every forward, e.g. embedding)")
    a = p.parse_args(argv)
    for t in a.traces:
        ev = load_events(t)
        print(f"{t}:\n{format_summary(summarize(ev))}")
        if a.step_start:
            st = steps(ev, a.step_start)
            print(format_steps(st, before=len(ev) - sum(s["events"] for s in st) if st else 0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
