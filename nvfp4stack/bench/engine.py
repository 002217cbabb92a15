"""Engine benchmark (``python main.py bench bench=engine``): the recipe's vLLM OpenAI
server, started the way ``serve`` starts it, once per MoE setting, and measured with vLLM's own
serving benchmark (``vllm bench serve``, random prompts, ignore_eos):

- decode: ``bench.engine_batches`` concurrent requests (``engine_decode_waves`` x batch in all, so
  the round is not only ramp-up) of ``engine_input_len`` prompt tokens and ``engine_output_len``
  generated tokens -> output tokens/s and median time per output token;
- prefill: ``engine_prefill_prompts`` prompts of ``engine_prefill_len`` tokens, one output token,
  ``engine_prefill_concurrency`` at a time -> prompt tokens/s and median time to first token.

Settings (``bench.engine_settings``) change only what they name, on the same recipe and engine keys:
``triton_w4a16`` (ours, W4A16), ``triton_w4a16+fp8`` (ours with the FP8 prefill copy), ``marlin``
(vLLM's NVFP4 W4A16 MoE), ``bf16`` (BF16 experts, vLLM's unquantized MoE), ``torch_emulation`` (ours
on CPU). The model is ``bench.engine_model``: ``synthetic`` builds (once, cached) the model family's
random benchmark model at flagship expert shapes (``ModelFamily.synthetic_checkpoint``); ``recipe``
serves the recipe's own checkpoint.
One table, with speed-ups of each of our settings over each baseline measured in the same run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import time
from pathlib import Path

from nvfp4stack.io_atomic import atomic_write_text
from nvfp4stack.run_dir import versions

BASELINES = ("marlin", "bf16")


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    moe: str | None            # backend.moe; None = the precision has no quantized experts
    fp8_prefill: bool = False
    experts: str = "nvfp4"     # which checkpoint variant it serves

    def apply(self, cfg, ckpt: Path | None, run_dir: Path, port: int):
        """The recipe's typed config with this setting's keys changed (validated as on the CLI)."""
        r = dataclasses.replace
        precision = cfg.precision
        backend = r(cfg.backend, moe_fp8_prefill=self.fp8_prefill, **({"moe": self.moe} if self.moe else {}))
        if self.experts == "bf16":
            precision = r(precision, routed_experts="bf16")
        model = r(cfg.model, path=str(ckpt)) if ckpt is not None else cfg.model
        return r(cfg, model=model, precision=precision, backend=backend, run_dir=str(run_dir),
                 engine=r(cfg.engine, port=port, dry_run=False))


SETTINGS = {s.name: s for s in (
    Setting("triton_w4a16", "triton_w4a16"),
    Setting("triton_w4a16+fp8", "triton_w4a16", fp8_prefill=True),
    Setting("marlin", "marlin"),
    Setting("bf16", None, experts="bf16"),
    Setting("torch_emulation", "torch_emulation"),
)}


def check_settings(names: list[str]) -> list[Setting]:
    unknown = [n for n in names if n not in SETTINGS]
    if unknown or not names:
        raise ValueError(f"bench.engine_settings: expected one or more of {', '.join(SETTINGS)}, found "
                         f"{list(names)!r}; fix: e.g. bench.engine_settings=[triton_w4a16,marlin,bf16]")
    return [SETTINGS[n] for n in names]


def synthetic_checkpoints(cfg, experts: set[str]) -> dict[str, Path]:
    """The synthetic benchmark model, one directory per expert format, built once under cache_dir by
    the recipe's model family (or, when it has none, the first family that builds one)."""
    from nvfp4stack.models.registry import families, get_family

    b = cfg.bench
    root = Path(cfg.cache_dir).expanduser() / "engine_bench"
    max_position = max(4096, b.engine_prefill_len + b.engine_output_len)
    own = get_family(cfg.model.family)
    for family in [own, *(f for f in families() if f is not own)]:
        out = {fmt: family.synthetic_checkpoint(root, fmt, b.engine_model_layers, max_position)
               for fmt in sorted(experts)}
        if all(d is not None for d in out.values()):
            return out
    raise ValueError("bench.engine_model=synthetic: no model family builds a synthetic benchmark model "
                     "(ModelFamily.synthetic_checkpoint); use bench.engine_model=recipe")


def vllm_bench_serve(base_url: str, model: str, tokenizer: Path, *, input_len: int, output_len: int,
                     prompts: int, concurrency: int, seed: int, log: Path) -> dict:
    """vLLM's ``bench serve`` (its own parser and code), twice: a warm-up round at the same load, then
    the measured round. The warm-up draws its random prompts from another seed: with the same prompts
    the measured round would hit vLLM's prefix cache and time cache hits, not prefill. Their console
    output goes to ``log``."""
    for round_seed in (seed + 1, seed):
        result = _bench_serve_once(base_url, model, tokenizer, input_len=input_len, output_len=output_len,
                                   prompts=prompts, concurrency=concurrency, seed=round_seed, log=log)
    return result


def _bench_serve_once(base_url: str, model: str, tokenizer: Path, *, input_len: int, output_len: int,
                      prompts: int, concurrency: int, seed: int, log: Path) -> dict:
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
        "--num-warmups", "0"])
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


def measure(cfg, base_url: str, model: str, tokenizer: Path, log: Path) -> dict[str, float]:
    b = cfg.bench
    out: dict[str, float] = {}
    for batch in b.engine_batches:
        r = vllm_bench_serve(base_url, model, tokenizer, input_len=b.engine_input_len,
                             output_len=b.engine_output_len, prompts=batch * b.engine_decode_waves,
                             concurrency=batch, seed=b.seed, log=log)
        out[f"decode b={batch} tok/s"] = r["output_throughput"]
        out[f"decode b={batch} TPOT ms"] = r["median_tpot_ms"]
        print(f"[bench engine]   decode batch {batch}: {r['output_throughput']:,.0f} tok/s, "
              f"TPOT {r['median_tpot_ms']:.2f} ms", flush=True)
    if b.engine_prefill_prompts:
        r = vllm_bench_serve(base_url, model, tokenizer, input_len=b.engine_prefill_len, output_len=1,
                             prompts=b.engine_prefill_prompts, concurrency=b.engine_prefill_concurrency,
                             seed=b.seed, log=log)
        out[f"prefill {b.engine_prefill_len} tok/s"] = r["total_input_tokens"] / r["duration"]
        out[f"prefill {b.engine_prefill_len} TTFT ms"] = r["median_ttft_ms"]
        print(f"[bench engine]   prefill {b.engine_prefill_len}: {out[f'prefill {b.engine_prefill_len} tok/s']:,.0f} "
              f"prompt tok/s, TTFT {r['median_ttft_ms']:.1f} ms", flush=True)
    return out


def speedup(metric: str, ours: float, base: float) -> float:
    """Above 1 = ours faster: a throughput over the baseline's, or the baseline's latency over ours."""
    return base / ours if metric.endswith((" ms", " s")) else ours / base


def table(results: dict[str, dict[str, float]]) -> list[dict]:
    """Rows = metrics, columns = settings, then ours/baseline speed-ups for every pair measured."""
    names = list(results)
    ours = [n for n in names if n not in BASELINES]
    bases = [n for n in names if n in BASELINES]
    metrics = list(dict.fromkeys(m for r in results.values() for m in r))
    rows = []
    for m in metrics:
        row = {"metric": m, **{n: round(results[n][m], 2) if m in results[n] else "" for n in names}}
        for o in ours:
            for base in bases:
                if m in results[o] and m in results[base]:
                    row[f"{o}/{base}"] = round(speedup(m, results[o][m], results[base][m]), 2)
        rows.append(row)
    return rows


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{torch.get_num_threads()} thread(s)"


def _engine_key(scfg) -> str:
    """What decides a setting's numbers besides the bench keys: the plan's inputs and the engine config."""
    return json.dumps({"precision": dataclasses.asdict(scfg.precision), "backend": dataclasses.asdict(scfg.backend),
                       "model": dataclasses.asdict(scfg.model), "arch": scfg.arch.name,
                       "engine": {k: v for k, v in dataclasses.asdict(scfg.engine).items() if k != "port"}},
                      sort_keys=True, default=str)


def _saved(sub: Path, keys: dict, scfg) -> dict | None:
    """A setting measured by an earlier run into the same run_dir, with the same keys, engine and device
    (a long benchmark resumes where it stopped: one setting per GPU-host visit)."""
    try:
        done = json.loads((sub / "result.json").read_text())
    except (OSError, ValueError):
        return None
    same = done.get("keys") == json.loads(json.dumps(keys, default=str)) and done.get("engine") == _engine_key(scfg)
    return done if same and done.get("device") == _device() else None


def run(cfg) -> int:
    from nvfp4stack.engine.args import format_cli
    from nvfp4stack.tasks.bench import format_rows
    from nvfp4stack.tasks.serve import serving

    b = cfg.bench
    settings = check_settings(list(b.engine_settings))
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if b.engine_model not in ("synthetic", "recipe"):
        raise ValueError(f"bench.engine_model: expected synthetic or recipe, found {b.engine_model!r}")
    ckpts = synthetic_checkpoints(cfg, {s.experts for s in settings}) if b.engine_model == "synthetic" else {}
    results: dict[str, dict[str, float]] = {}
    commands: dict[str, str] = {}
    keys = {k: getattr(b, k) for k in vars(b) if k.startswith("engine_") and k != "engine_settings"}
    for i, s in enumerate(settings):
        sub = run_dir / s.name.replace("+", "_")
        scfg = s.apply(cfg, ckpts.get(s.experts), sub, cfg.engine.port + i)
        done = _saved(sub, keys, scfg)
        if done is not None:
            results[s.name], commands[s.name] = done["results"], done["command"]
            print(f"[bench engine] {s.name}: measured earlier with the same keys and engine config, reusing "
                  f"{sub / 'result.json'} (delete it to measure again)", flush=True)
            continue
        print(f"[bench engine] {s.name}: starting the server ({i + 1}/{len(settings)})", flush=True)
        with serving(scfg) as (base_url, model, ready_s, argv, ckpt):
            commands[s.name] = format_cli(argv)
            print(f"[bench engine] {s.name}: ready in {ready_s:.0f} s", flush=True)
            results[s.name] = {"engine ready s": ready_s,
                               **measure(cfg, base_url, model, ckpt, sub / "vllm_bench_serve.log")}
        atomic_write_text(sub / "result.json", json.dumps(
            {"keys": keys, "engine": _engine_key(scfg), "results": results[s.name], "command": commands[s.name],
             "device": _device(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=2, default=str))
    rows = table(results)
    text = format_rows(rows)
    print("\nEngine benchmark (vLLM bench serve on the recipe's server; speed-ups > 1 = ours faster):\n" + text)
    atomic_write_text(run_dir / "metrics.json", json.dumps(
        {"bench": "engine", "results": results, "rows": rows, "commands": commands,
         "config": {k: getattr(b, k) for k in vars(b) if k.startswith("engine_")},
         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": _device(), "versions": versions()},
        indent=2, default=str))
    atomic_write_text(run_dir / "table.txt", text + "\n")
    print(f"[bench engine] wrote {run_dir / 'metrics.json'} and {run_dir / 'table.txt'}")
    return 0
