"""The table of a ``bench=engine`` run: every round's numbers -> per (setting, metric) the median [min-max]
spread, the speed-ups of ours over each baseline ("within noise" where the ranges overlap), each setting's
worst spread against issue #35's 5% goal, and the cells whose GPUs were mostly idle (host-bound)."""
from __future__ import annotations

from nvfp4stack.bench.engine_measure import BUSY
from nvfp4stack.bench.rounds import Cell, ratio_text, worst_spread

BASELINES = ("marlin", "humming", "bf16")
READY = "engine ready s"
SPREAD_GOAL = 0.05   # issue #35: repeats within 5% at every load
STEP = "TPOT ms"   # the decode step time metrics (engine_measure)
HOST_BOUND = 80.0    # GPU busy %, median of the rounds, under which a cell is flagged host-bound


def cells(results: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Cell]]:
    """Every round's numbers -> one Cell per (setting, metric)."""
    return {n: {m: Cell(tuple(v)) for m, v in res.items() if v} for n, res in results.items()}


def table(results: dict[str, dict[str, list[float]]]) -> list[dict]:
    """Rows = metrics, columns = settings (median [min-max] spread), then ours/baseline speed-ups of
    the medians for every pair measured ("within noise" where the ranges overlap)."""
    c = cells(results)
    names = list(results)
    ours = [n for n in names if n not in BASELINES]
    bases = [n for n in names if n in BASELINES]
    metrics = list(dict.fromkeys(m for r in c.values() for m in r))
    rows = []
    for m in metrics:
        row = {"metric": m, **{n: c[n][m].text() if m in c[n] else "" for n in names}}
        for o in ours:
            for base in bases:
                if m in c[o] and m in c[base] and not m.endswith(BUSY):   # a busy share is no speed
                    row[f"{o}/{base}"] = ratio_text(m, c[o][m], c[base][m])
        rows.append(row)
    return rows


def _against_goal(m: str, cell: Cell) -> str:
    verdict = "within" if cell.spread <= SPREAD_GOAL else "OVER"
    return f"{cell.spread:.1%} ({m}, {len(cell.values)} rounds), {verdict} the {SPREAD_GOAL:.0%} goal"


def spread_lines(results: dict[str, dict[str, list[float]]]) -> list[str]:
    """Per setting, the cell whose rounds moved most, against the 5% goal, and, where that is not a step
    time, the decode step time's (TPOT) worst too: a round's tok/s also counts the ramp and tail of each
    wave of requests, its TPOT only the steps, which is what a kernel changes. The ready time is left
    out: the first start of a round-robin pays for cold compile caches on purpose."""
    out = []
    for n, cs in cells(results).items():
        worst = worst_spread({m: cell for m, cell in cs.items() if m != READY and not m.endswith(BUSY)})
        if worst is None:
            out.append(f"{n}: one round, no spread")
            continue
        line = f"{n}: worst {_against_goal(*worst)}"
        step = worst_spread({m: cell for m, cell in cs.items() if m.endswith(STEP)})
        if step is not None and step[0] != worst[0]:
            line += f"; decode step time worst {_against_goal(*step)}"
        out.append(line)
    return out


def host_bound_line(results: dict[str, dict[str, list[float]]]) -> str | None:
    """The (setting, load) cells whose GPUs were busy under HOST_BOUND of the measured rounds (median):
    there the step waits on vLLM's host side, and a ratio cannot show a kernel difference. None when no
    busy share was measured (no NVML) or every cell kept the GPU busy."""
    low = [f"{n} {m.removesuffix(' ' + BUSY)} ({c.median:.1f}%)" for n, cs in cells(results).items()
           for m, c in cs.items() if m.endswith(BUSY) and c.median < HOST_BOUND]
    return (f"host-bound (GPU busy under {HOST_BOUND:.0f}% of the round; a kernel difference cannot show there): "
            + "; ".join(low)) if low else None


def ready_line(starts: list[str], cold_caches: bool, env: dict[str, str] | None = None) -> str | None:
    """What the ready row compares. With caches shared between starts (``bench.engine_cold_caches=false``) the
    first server started (``starts[0]``) may also build what every later start reuses, whatever its MoE backend:
    on a fresh H200 with vLLM 0.26, 75-100 s of FlashInfer's JIT build of the sampling module that vLLM's
    top-k/top-p sampler calls in the profiling run's dummy sampler step (Python stacks of the engine core every
    15 s, 2026-11-28, bench/RESULTS.md), unless the servers' environment ``env`` turns that sampler off
    (``VLLM_USE_FLASHINFER_SAMPLER=0``); on a machine whose caches were warm already, nothing. None when each
    start had empty caches of its own, or there was one start."""
    if cold_caches or len(starts) < 2:
        return None
    shared = ("torch.compile's and Triton's caches; FlashInfer's sampler off: VLLM_USE_FLASHINFER_SAMPLER=0"
              if _off((env or {}).get("VLLM_USE_FLASHINFER_SAMPLER"))
              else "on a fresh H200 with vLLM 0.26: FlashInfer's sampling module, 75-100 s")
    return (f"ready times: JIT caches shared between starts (bench.engine_cold_caches=false): the first start "
            f"({starts[0]}) may have built what the later ones reused ({shared}), so the ready ratios are not a "
            f"comparison; each setting's fresh-machine ready time: bench.engine_cold_caches=true")


def _off(value: str | None) -> bool:
    """A vLLM boolean variable set to false, read as vLLM reads it (``bool(int(value))``)."""
    try:
        return value is not None and not int(value)
    except ValueError:
        return False
