"""The client side of ``bench=engine``: one server measured with vLLM's own serving benchmark
(``vllm bench serve``: random prompts, ignore_eos), decode at each batch and the prefill round."""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from nvfp4stack.bench.gpu_busy import busy

BUSY = "GPU busy %"   # a metric suffix: NVML's busy share of the server's GPUs during the measured round


def vllm_bench_serve(base_url: str, model: str, tokenizer: Path, *, input_len: int, output_len: int,
                     prompts: int, concurrency: int, seed: int, log: Path, warm_up: bool = True,
                     devices: tuple[int, ...] = (0,)) -> dict:
    """vLLM's ``bench serve`` (its own parser and code), twice: a warm-up round at the same load, then
    the measured round (``warm_up=False``: the measured round alone, for a server that has already run
    this load). The warm-up draws its random prompts from another seed: with the same prompts the
    measured round would hit vLLM's prefix cache and time cache hits, not prefill. Their console
    output goes to ``log``. The result gains ``gpu_busy_percent``: the mean NVML utilization of
    ``devices`` during the measured round (None without NVML; gpu_busy.py)."""
    if warm_up:
        _bench_serve_once(base_url, model, tokenizer, input_len=input_len, output_len=output_len,
                          prompts=prompts, concurrency=concurrency, seed=seed + 1, log=log)
    with busy(list(devices)) as sampler:
        result = _bench_serve_once(base_url, model, tokenizer, input_len=input_len, output_len=output_len,
                                   prompts=prompts, concurrency=concurrency, seed=seed, log=log)
    return {**result, "gpu_busy_percent": sampler.percent}


def bench_serve_profiled(base_url: str, model: str, tokenizer: Path, *, input_len: int, output_len: int,
                         batch: int, seed: int, log: Path) -> dict:
    """One wave of ``batch`` requests with ``vllm bench serve --profile``: vLLM's profiler started before the
    first request and stopped after the last (the server needs ``--profiler-config``: engine_profile.py)."""
    return _bench_serve_once(base_url, model, tokenizer, input_len=input_len, output_len=output_len, prompts=batch,
                             concurrency=batch, seed=seed, log=log, profile=True)


def _bench_serve_once(base_url: str, model: str, tokenizer: Path, *, input_len: int, output_len: int,
                      prompts: int, concurrency: int, seed: int, log: Path, profile: bool = False) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", base_url.removesuffix("/v1"), "--model", model,
        "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--random-range-ratio", "0", "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
        "--seed", str(seed), "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl",
        "--num-warmups", "0"] + (["--profile"] if profile else []))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = main(args)
    with open(log, "a") as f:
        f.write(buf.getvalue())
    if result.get("failed"):
        errors = [e for e in result.get("errors", []) if e][:3]
        raise RuntimeError(f"vllm bench serve: {result['failed']} of {prompts} requests failed ({errors}); "
                           f"see {log} and the server log beside it")
    return result


def round_seed(base: int, rnd: int) -> int:
    """The prompts' seed of round ``rnd`` (its warm-up takes the next one): every round draws prompts no
    earlier round sent, so a server that stays up between rounds (``together``) never answers a measured
    round from its prefix cache."""
    return base + 2 * rnd


def measure(cfg, base_url: str, model: str, tokenizer: Path, log: Path, label: str = "",
            rnd: int = 0, warm_up: bool = True) -> dict[str, float]:
    b = cfg.bench
    seed = round_seed(b.seed, rnd)
    devices = server_gpus(cfg.engine)
    out: dict[str, float] = {}
    for batch in b.engine_batches:
        r = vllm_bench_serve(base_url, model, tokenizer, input_len=b.engine_input_len,
                             output_len=b.engine_output_len, prompts=batch * b.engine_decode_waves,
                             concurrency=batch, seed=seed, log=log, warm_up=warm_up, devices=devices)
        out[f"decode b={batch} tok/s"] = r["output_throughput"]
        out[f"decode b={batch} TPOT ms"] = r["median_tpot_ms"]
        busy_text = _keep_busy(out, f"decode b={batch}", r)
        print(f"[bench engine]   {label}decode batch {batch}: {r['output_throughput']:,.0f} tok/s, "
              f"TPOT {r['median_tpot_ms']:.2f} ms{busy_text}", flush=True)
    if b.engine_prefill_prompts:
        r = vllm_bench_serve(base_url, model, tokenizer, input_len=b.engine_prefill_len, output_len=1,
                             prompts=b.engine_prefill_prompts, concurrency=b.engine_prefill_concurrency,
                             seed=seed, log=log, warm_up=warm_up, devices=devices)
        name = f"prefill {b.engine_prefill_len}"
        out[f"{name} tok/s"] = r["total_input_tokens"] / r["duration"]
        out[f"{name} TTFT ms"] = r["median_ttft_ms"]
        busy_text = _keep_busy(out, name, r)
        print(f"[bench engine]   {label}{name}: {out[f'{name} tok/s']:,.0f} prompt tok/s, "
              f"TTFT {r['median_ttft_ms']:.1f} ms{busy_text}", flush=True)
    return out


def server_gpus(engine) -> tuple[int, ...]:
    """The GPUs (NVML's indices) a server of ``engine`` (an EngineConfig) runs on: its tp x dp ranks on the first
    of CUDA_VISIBLE_DEVICES (``engine.env``'s, else this process's) where that lists indices, else on 0, 1, ...
    (NVML numbers GPUs in PCI order, as CUDA does under CUDA_DEVICE_ORDER=PCI_BUS_ID; under CUDA's default
    order, or with UUIDs in CUDA_VISIBLE_DEVICES, the figure may be another GPU's)."""
    n = engine.tp * engine.dp
    listed = [v.strip() for v in engine.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "")).split(",")]
    if all(v.isdigit() for v in listed) and len(listed) >= n:
        return tuple(int(v) for v in listed[:n])
    return tuple(range(n))


def _keep_busy(out: dict[str, float], load: str, r: dict) -> str:
    """Keeps the load's GPU busy share in ``out`` (where NVML gave one); its text for the round's line."""
    if r.get("gpu_busy_percent") is None:
        return ""
    out[f"{load} {BUSY}"] = r["gpu_busy_percent"]
    return f", GPU busy {r['gpu_busy_percent']:.0f}%"
