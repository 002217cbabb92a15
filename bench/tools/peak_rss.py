"""Run a command and report its process tree's peak memory, summed over processes alive together.

  python bench/tools/peak_rss.py [--interval 0.05] [--json OUT] -- python main.py ... doctor checkpoint=DIR

``/usr/bin/time -v`` gives the largest single process's peak; a parent and the child it waits on
hold memory at the same time, so this samples every process of the tree (psutil, RSS) each
``--interval`` seconds and prints the peak of their sum, each process's own peak (from its exit
ru_maxrss where the kernel gives it: the parent's is exact, the sampled ones may miss a spike shorter
than the interval) and the wall time. Exit status: the command's.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import psutil


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("give the command after --")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    root = psutil.Process(proc.pid)
    peak_sum, at, per = 0, 0.0, {}
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        total = 0
        for p in tree:
            try:
                rss = p.memory_info().rss
                name = " ".join(p.cmdline()[1:4])[:80]
            except psutil.Error:
                continue
            total += rss
            key = f"{p.pid} {name}"
            per[key] = max(per.get(key, 0), rss)
        if total > peak_sum:
            peak_sum, at = total, time.perf_counter() - t0
        time.sleep(a.interval)
    rc = proc.wait()
    wall = time.perf_counter() - t0
    children_maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024   # the largest process
    out = {"rc": rc, "wall_s": round(wall, 2), "peak_tree_rss_bytes": peak_sum, "peak_at_s": round(at, 2),
           "largest_process_maxrss_bytes": children_maxrss, "per_process_peak_rss_bytes": per}
    mb = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
    print(f"peak_rss: exit {rc}, {wall:.1f} s wall; tree peak {mb(peak_sum)} (sum of live processes, at "
          f"{at:.1f} s); largest process maxrss {mb(children_maxrss)}", file=sys.stderr)
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"peak_rss:   {mb(v):>10}  {k}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
