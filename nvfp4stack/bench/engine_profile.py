"""``bench.engine_profile_batch``: one extra round of a setting at one batch under vLLM's torch profiler.

The server gets vLLM's own ``--profiler-config`` (torch profiler, traces under the start's ``profile/``
directory, no Python stacks, the engine core only; ``PROFILE_DELAY`` engine steps skipped after the round
starts, so that the first wave's prefill and ramp are not in it, then ``PROFILE_STEPS`` steps traced), and
after the setting's last measured round ``vllm bench serve --profile`` sends one wave at that batch, starting
and stopping the profiler around it. The round is not in the table: the profiler's own host work (it records
the worker's CPU side too) can lengthen the host's part of a step, so compare gaps between settings profiled
the same way, not with an unprofiled round's busy share.
What comes back is the worker's trace and ``summary.json`` / ``summary.txt`` (nvfp4stack/bench/trace_gaps.py):
the GPU's busy share over the traced steps, the largest kernels, and the idle gaps by the kernels around them.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from nvfp4stack.io_atomic import atomic_write_text

PROFILE_DELAY = 32   # engine steps after /start_profile before tracing (a wave's prefill is over by then)
PROFILE_STEPS = 16   # engine steps traced
TRACE_WAIT_S = 120.0


def profiler_config(trace_dir: Path, output_len: int) -> dict:
    """vLLM's ProfilerConfig fields (vllm/config/profiler.py, 0.26 and later) for ``--profiler-config``: the
    steps skipped and traced, ``PROFILE_DELAY`` and ``PROFILE_STEPS``, fewer where a request's ``output_len``
    tokens would end the wave before them (about a quarter of the steps skipped, up to half traced; vLLM counts
    the step that starts the profiler among those skipped or traced, so the skip may be one step shorter)."""
    delay, steps = min(PROFILE_DELAY, output_len // 4), min(PROFILE_STEPS, max(1, output_len // 2))
    return {"profiler": "torch", "torch_profiler_dir": str(trace_dir), "torch_profiler_with_stack": False,
            "ignore_frontend": True, "delay_iterations": delay, "max_iterations": steps}


def profiled(scfg, start_dir: Path):
    """``scfg`` whose server can be profiled into ``start_dir/profile`` where its ``bench.engine_profile_batch``
    asks for a profile, else as it is."""
    if scfg.bench.engine_profile_batch <= 0:
        return scfg
    pc = profiler_config(start_dir / "profile", scfg.bench.engine_output_len)
    args = [*scfg.engine.extra_args, "--profiler-config", json.dumps(pc)]
    return dataclasses.replace(scfg, engine=dataclasses.replace(scfg.engine, extra_args=args))


def traces(trace_dir: Path) -> list[Path]:
    return sorted(p for p in trace_dir.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
                  and p.name not in ("summary.json",))


def wait_for_traces(trace_dir: Path, timeout_s: float | None = None, old: frozenset = frozenset()) -> list[Path]:
    """The trace files not in ``old`` once their sizes have held for 2 s (the worker writes them after the
    profiler stops), waiting at most ``timeout_s`` (TRACE_WAIT_S)."""
    deadline = time.monotonic() + (TRACE_WAIT_S if timeout_s is None else timeout_s)
    last: dict[Path, int] = {}
    while time.monotonic() < deadline:
        now = {p: p.stat().st_size for p in traces(trace_dir) if p not in old}
        if now and now == last:
            return sorted(now)
        last = now
        time.sleep(2.0)
    return sorted(last)


def profile_round(cfg, server, start_dir: Path, label: str) -> dict | None:
    """One wave at ``bench.engine_profile_batch`` with the profiler on, its new traces summarized (an earlier
    run's in the same directory are left out); None, said in one line, where no trace came back within
    TRACE_WAIT_S or the round failed: a profile is a diagnosis, the measured rounds stand without it."""
    from nvfp4stack.bench.engine_measure import bench_serve_profiled
    from nvfp4stack.bench.trace_gaps import format_summary, load_events, summarize

    b = cfg.bench
    base_url, model, _argv, ckpt = server
    trace_dir = start_dir / "profile"
    trace_dir.mkdir(parents=True, exist_ok=True)
    old = frozenset(traces(trace_dir))
    try:
        bench_serve_profiled(base_url, model, ckpt, input_len=b.engine_input_len, output_len=b.engine_output_len,
                             batch=b.engine_profile_batch, seed=b.seed + 1000, log=trace_dir / "vllm_bench_serve.log")
        found = wait_for_traces(trace_dir, old=old)
        summaries = {str(p.relative_to(trace_dir)): summarize(load_events(p)) for p in found}
    except Exception as exc:  # noqa: BLE001 - said in one line; the measured rounds are saved already
        print(f"[bench engine]   {label}profile: failed ({type(exc).__name__}: {str(exc)[:300]}); see "
              f"{trace_dir} and the server log", flush=True)
        return None
    if not found:
        print(f"[bench engine]   {label}profile: no trace under {trace_dir} within {TRACE_WAIT_S:.0f} s "
              "(see the server log)", flush=True)
        return None
    text = "\n".join(f"{name}:\n{format_summary(s)}" for name, s in summaries.items())
    atomic_write_text(trace_dir / "summary.json", json.dumps(summaries, indent=2))
    atomic_write_text(trace_dir / "summary.txt", text + "\n")
    pc = profiler_config(trace_dir, b.engine_output_len)
    print(f"[bench engine]   {label}profile at batch {b.engine_profile_batch} ({pc['max_iterations']} engine steps "
          f"after {pc['delay_iterations']}), {trace_dir}:\n{text}", flush=True)
    return summaries
