"""vLLM 0.26's DeepGEMM warm-up with its compiles spread over processes (on by default where vLLM warms DeepGEMM).

vLLM's ``deep_gemm_warmup`` (``VLLM_DEEP_GEMM_WARMUP=relax``, its default) calls DeepGEMM's ``fp8_gemm_nt``
at every M of its list for each weight size of the FP8 block-scaled linears, one call after another, and
DeepGEMM compiles a kernel for each new tile configuration (2-3 s each on an H200 host: about 1,690 calls,
25 minutes, for the flagship recipe's model at TP=2). With the warm-up skipped, the compiles happen while
serving (37 in one client run, bench/RESULTS.md). DeepGEMM compiles in C++ without releasing the GIL, so threads
do not help; its cache directory (``DG_JIT_CACHE_DIR``) is safe across processes (a compile writes
``tmp/<pid>-...`` and renames it into place).

``install()`` wraps the name vLLM 0.26's ``kernel_warmup`` calls. Before vLLM's own warm-up, N child processes
(``python -P -m nvfp4stack.engine.deepgemm_warmup SPEC``, SPEC a JSON file: shapes, strides, dtypes, M values and
the worker's UE8M0 choice, nothing else) make vLLM's own calls, each on a contiguous run of every weight size's M
values, on this rank's GPU and into the same cache. The ranks of a tensor-parallel group (the same linears) split
the M values between them and wait for one another; then vLLM's warm-up runs as before and loads every kernel from
disk. N is ``NVFP4STACK_DEEPGEMM_WARMUP_PROCS``, else this rank's share of the host's cores, at most 8; 0 leaves
vLLM's warm-up as it is. Measured inside the flagship recipe's TP=2 servers on H200s (bench/RESULTS.md, 2026-11-27):
1,679 calls in 54-102 s with 8 processes per rank, against about 25 minutes one call after another. A child that
fails or runs past ``NVFP4STACK_DEEPGEMM_WARMUP_TIMEOUT_S`` (default and most 1500) costs only the speed-up: vLLM's own
warm-up compiles what is missing. Each child holds a CUDA context (about 0.5 GB of the GPU) and, case by case,
buffers for its share's largest M (vLLM's own warm-up allocates max_num_batched_tokens rows), while it runs.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

from nvfp4stack.engine.env_settings import cores_per_rank, env_int
from nvfp4stack.engine.kernel_warmup_hook import wrap_step

log = logging.getLogger("vllm.nvfp4stack")  # under vLLM's logger: its handlers, in the server log

ENV_PROCS = "NVFP4STACK_DEEPGEMM_WARMUP_PROCS"
ENV_TIMEOUT = "NVFP4STACK_DEEPGEMM_WARMUP_TIMEOUT_S"


def tensor_spec(t) -> dict:
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).removeprefix("torch.")}


def empty_from_spec(spec: dict, device: str):
    """An uninitialized tensor of ``tensor_spec``'s layout: a child needs the layout, not the values."""
    import torch

    return torch.empty_strided(spec["shape"], spec["stride"], dtype=getattr(torch, spec["dtype"]), device=device)


def gemm_cases(model, max_tokens: int, *, may_use: Callable, extract: Callable, m_values: Callable,
               done: set = frozenset()) -> list[dict]:
    """One case per weight size vLLM's warm-up would run: the weight's and its scales' layout and the M values.

    ``may_use``, ``extract``, ``m_values`` are vLLM 0.26's ``_fp8_linear_may_use_deep_gemm``,
    ``_extract_data_from_linear_base_module`` and ``_get_fp8_gemm_nt_m_values``; ``done``: sizes it warmed already."""
    cases: dict = {}
    for module in model.modules():
        if not may_use(module):
            continue
        w, ws, _ = extract(module)
        if w.size() in done or tuple(w.size()) in cases:
            continue
        cases[tuple(w.size())] = {"w": tensor_spec(w), "ws": tensor_spec(ws),
                                  "m": [int(m) for m in m_values(w, max_tokens)]}
    return list(cases.values())


STRIPES = 8   # stripes of each case's M list per rank: every rank gets low and high M alike


def shares(cases: list[dict], procs: int, part: int = 0, parts: int = 1) -> list[list[dict]]:
    """This part's work: each case's M values cut into ``STRIPES * parts`` contiguous stripes, stripe k to part
    ``k % parts`` (low M values reach more tile configurations than high ones: striping keeps the ranks' parts
    alike, and a part never depends on how many children another rank runs), then the part's M values cut into
    ``procs`` contiguous runs, run i of every case to child i (empty shares dropped). Neighbouring M values mostly
    need the same kernel (DeepGEMM's key has N, K and the tile configuration, not M): contiguous runs keep each
    kernel's compile in one child, but at a run's edge."""
    procs, parts = max(1, procs), max(1, parts)
    out: list[list[dict]] = [[] for _ in range(procs)]
    for case in cases:
        ms, total = case["m"], STRIPES * parts
        mine = [m for k in range(part, total, parts) for m in ms[len(ms) * k // total:len(ms) * (k + 1) // total]]
        for i, share in enumerate(out):
            run = mine[len(mine) * i // procs:len(mine) * (i + 1) // procs]
            if run:
                share.append({**case, "m": run})
    return [s for s in out if s]


_CHILD_WORK: dict[str, Callable] = {}   # "module:function" a child runs -> the items for it, from (model, max_tokens)


def add_child_work(entry: str, items: Callable) -> None:
    """More DeepGEMM kernels for the children to compile: ``items(model, max_tokens)`` (in the worker) gives a list
    of JSON values, dealt to the children like the GEMM calls; each child calls ``entry`` ("module:function", imported
    there) with its items. A model family registers its own (its layers' kernels) from ``register_vllm``."""
    _CHILD_WORK[entry] = items


def deal(items: list, procs: int, part: int = 0, parts: int = 1) -> list[list]:
    """``items`` dealt in turn to the ``parts`` ranks, then each rank's in turn to its ``procs`` children; this part's
    ``procs`` lists (some may be empty). A rank's items never depend on another rank's number of children."""
    mine = items[part::max(1, parts)]
    return [mine[i::max(1, procs)] for i in range(max(1, procs))]


def _stop(p: subprocess.Popen) -> None:
    """Kill a child and everything it started (its nvcc), then reap it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()
    p.wait()


def run_children(specs: list[dict], timeout_s: float, command: list[str] | None = None) -> tuple[int, int]:
    """Run one child per spec at once (the spec in a temporary JSON file, its path the last argument); (finished,
    failed or timed out). Every child is stopped and reaped before this returns, whatever happens here."""
    command = command or [sys.executable, "-P", "-m", "nvfp4stack.engine.deepgemm_warmup"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))   # this process's imports
    procs: list[tuple[subprocess.Popen, object]] = []
    ok = failed = 0
    with tempfile.TemporaryDirectory(prefix="nvfp4stack-dg-") as tmp:
        try:
            for i, spec in enumerate(specs):
                path = os.path.join(tmp, f"spec-{i}.json")
                with open(path, "w") as f:
                    json.dump(spec, f)
                err = tempfile.TemporaryFile(mode="w+", dir=tmp)
                procs.append((subprocess.Popen(command + [path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=err, env=env, start_new_session=True), err))
            deadline = time.monotonic() + timeout_s
            for p, err in procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _stop(p)
                    failed += 1
                    log.warning("nvfp4stack: a DeepGEMM warm-up child ran past %.0f s (%s) and was stopped; "
                                "vLLM's own warm-up compiles what it left", timeout_s, ENV_TIMEOUT)
                    continue
                if p.returncode == 0:
                    ok += 1
                    continue
                failed += 1
                err.seek(0)
                tail = err.read().strip().splitlines()[-3:]
                log.warning("nvfp4stack: a DeepGEMM warm-up child failed (exit %s): %s; vLLM's own warm-up "
                            "compiles what it left", p.returncode, " | ".join(tail))
        finally:
            for p, err in procs:
                if p.poll() is None:
                    _stop(p)
                err.close()
    return ok, failed


BARRIER_S = 1800   # vLLM 0.26's CPU group: PyTorch's default gloo timeout, which the ranks' wait must stay under


def child_timeout() -> int:
    """``NVFP4STACK_DEEPGEMM_WARMUP_TIMEOUT_S`` (default 1500), at most 1500 s: the ranks of a group wait for one
    another afterwards on a group whose timeout is 1800 s, and a rank done early must not time out there."""
    want = env_int(ENV_TIMEOUT, 1500, 1)
    if want > BARRIER_S - 300:
        log.warning("nvfp4stack: %s=%d: the ranks then wait for one another on a group with a %d s timeout; "
                    "using %d s", ENV_TIMEOUT, want, BARRIER_S, BARRIER_S - 300)
    return min(want, BARRIER_S - 300)


def precompile(model, max_tokens: int, procs: int, device_index: int, rank: int = 0, ranks: int = 1) -> int:
    """Compile this rank's part (``rank`` of ``ranks``) of the kernels vLLM 0.26's warm-up will ask for in ``procs``
    children; the number of calls dealt here."""
    from vllm.model_executor.warmup import deep_gemm_warmup as dw

    cases = gemm_cases(model, max_tokens, may_use=dw._fp8_linear_may_use_deep_gemm,
                       extract=dw._extract_data_from_linear_base_module, m_values=dw._get_fp8_gemm_nt_m_values,
                       done=dw.FP8_GEMM_NT_WARMUP_CACHE)
    gemm_parts = shares(cases, procs, rank, ranks)
    work = {entry: deal(list(items(model, max_tokens)), procs, rank, ranks) for entry, items in _CHILD_WORK.items()}
    calls = sum(len(c["m"]) for share in gemm_parts for c in share)
    extra = sum(len(lst) for dealt in work.values() for lst in dealt)
    if not calls + extra:
        return 0
    t0 = time.perf_counter()
    from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used

    e8m0 = bool(is_deep_gemm_e8m0_used())   # this worker's own answer, not a fresh process's
    specs = []
    for i in range(max(1, procs)):
        share = gemm_parts[i] if i < len(gemm_parts) else []
        mine = {entry: dealt[i] for entry, dealt in work.items() if dealt[i]}
        if share or mine:
            specs.append({"device": device_index, "e8m0": e8m0, "cases": share, "work": mine})
    ok, failed = run_children(specs, child_timeout())
    log.info("nvfp4stack: DeepGEMM warm-up: %d calls over %d weight sizes and %d more kernels' calls in %d "
             "processes (%d failed) in %.1f s (rank %d of %d)", calls, len(cases), extra, len(specs), failed,
             time.perf_counter() - t0, rank, ranks)
    return calls + extra


def child_main(spec: dict, gemm: Callable | None = None, block_k: int | None = None, device: str = "cuda") -> None:
    """A child's work: vLLM's own warm-up calls (``_deepgemm_fp8_gemm_nt_warmup``) for its share, then each
    registered entry (``add_child_work``) with its items."""
    import importlib

    import torch

    if gemm is None:
        torch.cuda.set_device(spec["device"])   # before DeepGEMM's first (lazy) start, which reads the device
        from vllm.utils.deep_gemm import fp8_gemm_nt, get_mk_alignment_for_contiguous_layout

        def gemm(a, b, out):
            fp8_gemm_nt(a, b, out, is_deep_gemm_e8m0_used=spec["e8m0"])

        block_k = get_mk_alignment_for_contiguous_layout()[0]
    for case in spec["cases"]:
        w, ws = empty_from_spec(case["w"], device), empty_from_spec(case["ws"], device)
        n, k = w.shape
        rows = max(case["m"])   # this share's largest M: a child holds no more than its calls need
        a = torch.empty((rows, k), device=device, dtype=torch.float8_e4m3fn)
        a_scales = torch.empty((rows, k // block_k), device=device, dtype=torch.float32)
        out = torch.empty((rows, n), device=device, dtype=torch.bfloat16)
        for m in case["m"]:
            gemm((a[:m], a_scales[:m]), (w, ws), out[:m])
    for entry, items in spec.get("work", {}).items():
        module, _, name = entry.partition(":")
        getattr(importlib.import_module(module), name)(items, device)
    if device == "cuda":
        torch.cuda.synchronize()


def tp_part() -> tuple[int, int, object]:
    """(this rank, ranks, the group to wait on or None): the ranks of one tensor-parallel group run the same
    linears, so each compiles a part of the kernels into the shared cache; (0, 1, None) outside such a group, and
    where the ranks span hosts (DeepGEMM's cache is a host's own: each rank then compiles all of it)."""
    try:
        from vllm.distributed import get_tp_group
        from vllm.distributed.parallel_state import get_node_count

        group = get_tp_group()
        rank, ranks = int(group.rank_in_group), int(group.world_size)
        hosts = int(get_node_count())
    except Exception:   # no distributed state (a single process, or a test): all of the work here
        return 0, 1, None
    return (rank, ranks, group) if ranks > 1 and hosts == 1 else (0, 1, None)


def child_procs() -> int:
    """Children per rank: ``NVFP4STACK_DEEPGEMM_WARMUP_PROCS``, else this rank's share of the host's cores, at most
    8; 0 where the setting turns them off."""
    setting = env_int(ENV_PROCS, -1, 0)
    return setting if setting >= 0 else max(1, min(8, cores_per_rank()))


def _not_installed(setting: int, why: str) -> None:
    """A warning where the processes were asked for by name; a debug line where they are only the default."""
    (log.warning if setting > 0 else log.debug)("nvfp4stack: %s: %s; vLLM's DeepGEMM warm-up left as it is",
                                                ENV_PROCS if setting > 0 else "DeepGEMM warm-up over processes", why)


def install() -> bool:
    """Wrap vLLM 0.26's ``kernel_warmup.deep_gemm_warmup`` unless ``NVFP4STACK_DEEPGEMM_WARMUP_PROCS=0``; False
    then, or where that vLLM has no such helpers (another version, no CUDA build)."""
    setting = env_int(ENV_PROCS, -1, 0)   # -1: unset (or not a number: warned), this rank's share of the cores
    if setting == 0:
        return False
    try:
        from vllm.model_executor.warmup import deep_gemm_warmup as dw
        from vllm.model_executor.warmup import kernel_warmup
    except Exception as e:   # never let an optional warm-up stop vLLM's plugin loading
        _not_installed(setting, f"vLLM's DeepGEMM warm-up could not be imported ({type(e).__name__}: {e})")
        return False
    needed = ("_fp8_linear_may_use_deep_gemm", "_extract_data_from_linear_base_module", "_get_fp8_gemm_nt_m_values")
    if getattr(kernel_warmup, "deep_gemm_warmup", None) is None or not all(hasattr(dw, n) for n in needed):
        _not_installed(setting, "this vLLM's DeepGEMM warm-up is not 0.26's")
        return False

    def make(vllms):
        def deep_gemm_warmup(model, max_tokens: int):
            procs = child_procs()
            rank, ranks, group = tp_part()
            try:
                import torch

                precompile(model, max_tokens, procs, torch.cuda.current_device(), rank, ranks)
            except Exception as e:   # an optimization: vLLM's own warm-up compiles everything as before
                log.warning("nvfp4stack: DeepGEMM warm-up in %d processes stopped (%s: %s); vLLM's own warm-up "
                            "compiles one kernel after another; %s=0 skips this step", procs,
                            type(e).__name__, e, ENV_PROCS)
            if group is not None:   # every rank's part is on disk before any rank's own warm-up looks for it
                group.barrier()
            return vllms(model, max_tokens)

        return deep_gemm_warmup

    return wrap_step("deep_gemm_warmup", make)


if __name__ == "__main__":
    with open(sys.argv[1]) as spec_file:
        child_main(json.load(spec_file))
