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
(vLLM's NVFP4 W4A16 MoE), ``humming`` (vLLM 0.26's Humming NVFP4 MoE, ``--moe-backend humming``;
skipped on a model that sets ``swiglu_limit``, where vLLM refuses it), ``bf16`` (BF16 experts, vLLM's
unquantized MoE), ``torch_emulation`` (ours on CPU). The model is ``bench.engine_model``:
``synthetic`` builds (once, cached) the model family's random benchmark model at flagship expert
shapes (``ModelFamily.synthetic_checkpoint``); ``drawn`` serves the same model with no checkpoint on disk,
its weights drawn at load (``engine.load_format=synthetic``: any depth, BF16 experts included, where the
disk would not hold them); ``recipe`` serves the recipe's own checkpoint.

Every setting is measured in ``bench.engine_rounds`` rounds (bench/rounds.py: interleaved, every
other round backwards). ``bench.engine_servers``: ``one_at_a_time`` starts a setting's server for
each of its rounds (one GPU holds one server; the ready time gets a value per round);
``sequential`` starts each setting's server once and takes all its rounds on that start, one
server alive at a time; ``together`` starts each setting's server once, all of them alive at once with
``engine.gpu_memory_utilization`` split between them, and runs every round on those starts.
One table: per cell the median [min-max] and the spread (max-min)/median of the rounds, and the
speed-ups of each of our settings over each baseline measured in the same run ("within noise" where
the two ranges overlap). metrics.json keeps every round's numbers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path

from nvfp4stack.bench.engine_measure import measure
from nvfp4stack.bench.engine_profile import profile_round, profiled
from nvfp4stack.bench.engine_table import BASELINES, READY, cells, host_bound_line, ready_line, spread_lines, table
from nvfp4stack.bench.rounds import schedule
from nvfp4stack.engine.args import SYNTHETIC
from nvfp4stack.io_atomic import atomic_write_text
from nvfp4stack.plan.kv_cache import DEFAULT_GPU_UTIL  # vLLM's own default, split by servers=together
from nvfp4stack.run_dir import environment, versions


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    moe: str | None            # backend.moe; None = the precision has no quantized experts
    fp8_prefill: bool = False
    experts: str = "nvfp4"     # which checkpoint variant it serves
    swiglu_clamp: bool = True  # the kernel applies a model's SwiGLU clamp (swiglu_limit)

    def apply(self, cfg, ckpt: Path | None, run_dir: Path, port: int, gpu_memory_utilization: float | None = None,
              drawn: bool = False):
        """The recipe's typed config with this setting's keys changed (validated as on the CLI); ``drawn``:
        ``ckpt`` is the synthetic model's weight-free directory, its weights drawn at load in the format it
        declares (model.source_format modelopt for NVFP4 experts, bf16 otherwise)."""
        r = dataclasses.replace
        precision = cfg.precision
        backend = r(cfg.backend, moe_fp8_prefill=self.fp8_prefill, **({"moe": self.moe} if self.moe else {}))
        if self.experts == "bf16":
            precision = r(precision, routed_experts="bf16")
        model = r(cfg.model, path=str(ckpt)) if ckpt is not None else cfg.model
        engine = r(cfg.engine, port=port, dry_run=False)
        if drawn:
            model = r(model, source_format="modelopt" if self.experts == "nvfp4" else "bf16")
            engine = r(engine, load_format=SYNTHETIC)
        if gpu_memory_utilization is not None:
            engine = r(engine, gpu_memory_utilization=gpu_memory_utilization)
        return r(cfg, model=model, precision=precision, backend=backend, run_dir=str(run_dir), engine=engine)

    def clamp_refusal(self, hf: dict, where: str) -> str | None:
        """Why this setting cannot serve a model whose config sets ``swiglu_limit``, or None.

        vLLM 0.26's NVFP4 MoE oracle (fused_moe/oracle/nvfp4.py) keeps only FLASHINFER_TRTLLM,
        FLASHINFER_CUTLASS and MARLIN when the layer has a swiglu_limit, and raises on an explicit
        --moe-backend outside them; on Hopper that leaves Marlin."""
        limit = hf.get("swiglu_limit", (hf.get("text_config") or {}).get("swiglu_limit"))
        if self.swiglu_clamp or limit is None:
            return None
        return (f"bench.engine_settings: {self.name} skipped: the model sets swiglu_limit={limit} ({where}) and "
                f"vLLM's {self.name} NVFP4 MoE does not apply the SwiGLU clamp (vLLM refuses --moe-backend "
                f"{self.moe} there); Marlin is the only stock NVFP4 MoE choice for this model")


SETTINGS = {s.name: s for s in (
    Setting("triton_w4a16", "triton_w4a16"),
    Setting("triton_w4a16+fp8", "triton_w4a16", fp8_prefill=True),
    Setting("marlin", "marlin"),
    Setting("humming", "humming", swiglu_clamp=False),
    Setting("bf16", None, experts="bf16"),
    Setting("torch_emulation", "torch_emulation"),
)}


def check_settings(names: list[str]) -> list[Setting]:
    unknown = [n for n in names if n not in SETTINGS]
    if unknown or not names:
        raise ValueError(f"bench.engine_settings: expected one or more of {', '.join(SETTINGS)}, found "
                         f"{list(names)!r}; fix: e.g. bench.engine_settings=[triton_w4a16,marlin,bf16]")
    return [SETTINGS[n] for n in names]


def servable(cfg, settings: list[Setting], ckpts: dict[str, Path]) -> list[Setting]:
    """The settings vLLM would serve this model with: one line for each that it would refuse."""
    from nvfp4stack.families.resolve import config_json_path
    from nvfp4stack.plan.groups import load_config_json

    out = []
    for s in settings:
        if not s.swiglu_clamp:
            scfg = s.apply(cfg, ckpts.get(s.experts), Path(cfg.run_dir), cfg.engine.port, drawn=drawn(cfg))
            path = config_json_path(scfg.model, scfg.cache_dir)
            why = s.clamp_refusal(load_config_json(path), str(path))
            if why:
                print(f"[bench engine] {why}", flush=True)
                continue
        out.append(s)
    if not out:
        raise ValueError(f"bench.engine_settings: nothing left to measure on this model from "
                         f"{[s.name for s in settings]!r}; fix: e.g. bench.engine_settings=[triton_w4a16,marlin,bf16]")
    return out


def drawn(cfg) -> bool:
    """bench.engine_model=drawn: the synthetic model's weights drawn at load, no checkpoint files."""
    return cfg.bench.engine_model == "drawn"


def synthetic_checkpoints(cfg, experts: set[str]) -> dict[str, Path]:
    """The synthetic benchmark model, one directory per expert format, built once under cache_dir by
    the recipe's model family (or, when it has none, the first family that builds one); weight-free
    directories under bench.engine_model=drawn."""
    from nvfp4stack.families.registry import families, get_family

    b = cfg.bench
    root = Path(cfg.cache_dir).expanduser() / "engine_bench"
    max_position = max(4096, b.engine_prefill_len + b.engine_output_len)
    own = get_family(cfg.model.family)
    for family in [own, *(f for f in families() if f is not own)]:
        out = {fmt: family.synthetic_checkpoint(root, fmt, b.engine_model_layers, max_position, drawn=drawn(cfg))
               for fmt in sorted(experts)}
        if all(d is not None for d in out.values()):
            return out
    raise ValueError("bench.engine_model=synthetic: no model family builds a synthetic benchmark model "
                     "(ModelFamily.synthetic_checkpoint); use bench.engine_model=recipe")


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
    """A round measured by an earlier run into the same run_dir, with the same keys, engine and device
    (a long benchmark resumes where it stopped, round by round)."""
    try:
        done = json.loads((sub / "result.json").read_text())
    except (OSError, ValueError):
        return None
    same = done.get("keys") == json.loads(json.dumps(keys, default=str)) and done.get("engine") == _engine_key(scfg)
    return done if same and done.get("device") == _device() else None


def _save(sub: Path, keys: dict, scfg, result: dict, command: str, rnd: int, warm_up: bool) -> None:
    atomic_write_text(sub / "result.json", json.dumps(
        {"keys": keys, "engine": _engine_key(scfg), "results": result, "command": command, "round": rnd,
         "warm_up": warm_up,
         "device": _device(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=2, default=str))


@dataclasses.dataclass
class Bench:
    """One bench=engine run: what is measured, where, and what came back round by round."""

    cfg: object
    settings: list[Setting]
    ckpts: dict[str, Path]
    keys: dict
    rounds: dict[str, dict[int, dict[str, float]]] = dataclasses.field(default_factory=dict)
    commands: dict[str, str] = dataclasses.field(default_factory=dict)
    starts: list[str] = dataclasses.field(default_factory=list)   # setting per server start, in order
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)   # setting -> why its server did not start

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)

    def setting_dir(self, s: Setting) -> Path:
        return self.run_dir / s.name.replace("+", "_")

    def port(self, s: Setting) -> int:
        return self.cfg.engine.port + self.settings.index(s)

    def order(self) -> list[tuple[int, Setting]]:
        by_name = {s.name: s for s in self.settings}
        names = [s.name for s in self.settings]
        return [(r, by_name[n]) for r, n in schedule(names, BASELINES, self.cfg.bench.engine_rounds)]

    def reuse(self, r: int, s: Setting, scfg) -> bool:
        sub = self.setting_dir(s) / f"round-{r}"
        done = _saved(sub, self.keys, scfg)
        if done is None:
            return False
        self.record(r, s, done["results"], done["command"])
        print(f"[bench engine] round {r + 1} {s.name}: measured earlier with the same keys and engine config, "
              f"reusing {sub / 'result.json'} (delete it to measure again)", flush=True)
        return True

    def record(self, r: int, s: Setting, result: dict[str, float], command: str) -> None:
        self.rounds.setdefault(s.name, {})[r] = result
        self.commands[s.name] = command

    def measure_round(self, r: int, s: Setting, scfg, server, ready_s: float | None, warm_up: bool = True) -> None:
        from nvfp4stack.engine.args import format_cli

        base_url, model, argv, ckpt = server
        sub = self.setting_dir(s) / f"round-{r}"
        sub.mkdir(parents=True, exist_ok=True)
        label = f"round {r + 1} {s.name}: "
        result = ({READY: ready_s} if ready_s is not None else {}) | measure(
            self.cfg, base_url, model, ckpt, sub / "vllm_bench_serve.log", label, rnd=r, warm_up=warm_up)
        command = format_cli(argv)
        self.record(r, s, result, command)
        _save(sub, self.keys, scfg, result, command, r, warm_up)
        if self.cfg.bench.engine_profile_batch and r == self.cfg.bench.engine_rounds - 1:   # not in the table
            profile_round(self.cfg, server, Path(scfg.run_dir), label)

    def start(self, s: Setting, scfg, stack: contextlib.ExitStack):
        from nvfp4stack.tasks.serve import serving

        print(f"[bench engine] {s.name}: starting the server (start {len(self.starts) + 1})", flush=True)
        base_url, model, ready_s, argv, ckpt = stack.enter_context(serving(scfg))
        self.starts.append(s.name)
        print(f"[bench engine] {s.name}: ready in {ready_s:.0f} s", flush=True)
        return (base_url, model, argv, ckpt), ready_s

    def try_start(self, s: Setting, scfg, stack: contextlib.ExitStack):
        """``start``, or (None, None) with the setting left out, one line saying why: a baseline whose
        server cannot start (a JIT toolchain missing on the host, too little memory) must not take the
        settings already measured with it."""
        try:
            return self.start(s, scfg, stack)
        except Exception as exc:  # noqa: BLE001 - said in one line and in metrics.json; Ctrl-C still stops the run
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            self.left_out[s.name] = f"{type(exc).__name__}: {first}"
            print(f"[bench engine] {s.name}: left out, its server did not start ({self.left_out[s.name]}); "
                  f"its logs are under {self.setting_dir(s)}", flush=True)
            return None, None

    def server_cfg(self, s: Setting, where: Path, gpu_memory_utilization: float | None = None):
        """The setting's typed config for a server start whose run dir (and, with cold caches, caches) is
        ``where``."""
        scfg = s.apply(self.cfg, self.ckpts.get(s.experts), where, self.port(s),
                       gpu_memory_utilization=gpu_memory_utilization, drawn=drawn(self.cfg))
        return profiled(self.cold(scfg, where), where)

    def cold(self, scfg, start_dir: Path):
        """``scfg`` with empty JIT/compile caches of its own under ``start_dir`` (bench.engine_cold_caches),
        else as it is."""
        if not self.cfg.bench.engine_cold_caches:
            return scfg
        from nvfp4stack.bench.cold_caches import cold_cache_env

        env = {**scfg.engine.env, **cold_cache_env(start_dir / "jit-caches")}
        return dataclasses.replace(scfg, engine=dataclasses.replace(scfg.engine, env=env))

    def one_at_a_time(self) -> None:
        """A server start per (round, setting): one GPU holds one vLLM server."""
        for r, s in self.order():
            sub = self.setting_dir(s) / f"round-{r}"
            scfg = self.server_cfg(s, sub)
            if s.name in self.left_out or self.reuse(r, s, scfg):
                continue
            with contextlib.ExitStack() as stack:
                server, ready_s = self.try_start(s, scfg, stack)
                if server is not None:
                    self.measure_round(r, s, scfg, server, ready_s)

    def sequential(self) -> None:
        """Each setting's server started once and alone on the GPU: all its rounds back to back on that
        start (a warm-up before the first only: the shapes a round sends are compiled by then), then it
        is stopped and the next setting's starts. No server shares the GPU or the host with another, at
        one start per setting; the rounds of different settings are not interleaved."""
        for s in self.settings_in_order():
            scfg = self.server_cfg(s, self.setting_dir(s))
            todo = [r for r in range(self.cfg.bench.engine_rounds) if not self.reuse(r, s, scfg)]
            if not todo:
                continue
            with contextlib.ExitStack() as stack:
                server, ready_s = self.try_start(s, scfg, stack)
                if server is None:
                    continue
                for i, r in enumerate(todo):
                    self.measure_round(r, s, scfg, server, ready_s if i == 0 else None, warm_up=i == 0)

    def settings_in_order(self) -> list[Setting]:
        """The settings in the first round's order (ours and the baselines alternating)."""
        return list(dict.fromkeys(s for _, s in self.order()))

    def together(self) -> None:
        """Each setting's server started once (when its first round comes), all alive at once with
        the GPU memory split between them; every round runs on those starts."""
        util = (self.cfg.engine.gpu_memory_utilization or DEFAULT_GPU_UTIL) / len(self.settings)
        scfgs = {s.name: self.server_cfg(s, self.setting_dir(s), gpu_memory_utilization=round(util, 4))
                 for s in self.settings}
        servers: dict[str, tuple] = {}
        with contextlib.ExitStack() as stack:
            for r, s in self.order():
                scfg = scfgs[s.name]
                if s.name in self.left_out or self.reuse(r, s, scfg):
                    continue
                ready_s = None
                if s.name not in servers:
                    servers[s.name], ready_s = self.try_start(s, scfg, stack)
                    if servers[s.name] is None:
                        continue
                self.measure_round(r, s, scfg, servers[s.name], ready_s)

    def results(self) -> dict[str, dict[str, list[float]]]:
        """{setting: {metric: [value per round, in round order]}}."""
        out: dict[str, dict[str, list[float]]] = {}
        for s in self.settings:
            if s.name not in self.rounds:   # left out: its server never started
                continue
            per = self.rounds[s.name]
            metrics = list(dict.fromkeys(m for r in sorted(per) for m in per[r]))
            out[s.name] = {m: [per[r][m] for r in sorted(per) if m in per[r]] for m in metrics}
        return out


def run(cfg) -> int:
    from nvfp4stack.tasks.bench import format_rows

    b = cfg.bench
    settings = check_settings(list(b.engine_settings))
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if b.engine_model not in ("synthetic", "drawn", "recipe"):
        raise ValueError(f"bench.engine_model: expected synthetic, drawn or recipe, found {b.engine_model!r}; "
                         "fix: bench.engine_model=synthetic")
    ckpts = synthetic_checkpoints(cfg, {s.experts for s in settings}) if b.engine_model != "recipe" else {}
    settings = servable(cfg, settings, ckpts)
    # a round's numbers do not depend on how many rounds there are: a run with more rounds reuses them
    unkeyed = ("engine_settings", "engine_rounds", "engine_profile_batch")   # (a profiled server is keyed by its args)
    keys = {k: getattr(b, k) for k in vars(b) if k.startswith("engine_") and k not in unkeyed}
    bench = Bench(cfg, settings, ckpts, keys)
    print(f"[bench engine] {b.engine_rounds} round(s) of {', '.join(s.name for s in settings)}, "
          f"servers {b.engine_servers}; order: "
          + ", ".join(f"{r + 1}:{s.name}" for r, s in bench.order()), flush=True)
    getattr(bench, b.engine_servers)()
    results = bench.results()
    left_out = "; ".join(f"{n}: {w}" for n, w in bench.left_out.items())
    if not results:
        raise RuntimeError(f"bench=engine: no setting's server started ({left_out}); the serve logs are under {run_dir}")
    rows = table(results)
    spreads = spread_lines(results)
    text = format_rows(rows) + "\nspread (max-min)/median per setting: " + "; ".join(spreads)
    if host_bound := host_bound_line(results):
        text += "\n" + host_bound
    env = environment(cfg.engine.env, cfg.engine.api_key_env)   # what the servers saw (it changes starts, kernels)
    ready = ready_line(bench.starts, b.engine_cold_caches, env)
    if ready:
        text += "\n" + ready
    if bench.left_out:
        text += f"\nleft out (server did not start): {left_out}"
    print(f"\nEngine benchmark (vLLM bench serve on the recipe's server, {b.engine_rounds} round(s), servers "
          f"{b.engine_servers}; cells: median [min-max] spread; speed-ups > 1 = ours faster):\n" + text)
    atomic_write_text(run_dir / "metrics.json", json.dumps(
        {"bench": "engine", "results": results,
         "summary": {n: {m: c.to_dict() for m, c in cs.items()} for n, cs in cells(results).items()},
         "rows": rows, "spread": spreads, "host_bound": host_bound, "ready": ready, "commands": bench.commands,
         "server_starts": bench.starts,
         "left_out": bench.left_out,
         "config": {k: getattr(b, k) for k in vars(b) if k.startswith("engine_")},
         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": _device(), "versions": versions(),
         "environment": env},
        indent=2, default=str))
    atomic_write_text(run_dir / "table.txt", text + "\n")
    print(f"[bench engine] wrote {run_dir / 'metrics.json'} and {run_dir / 'table.txt'}")
    return 1 if bench.left_out else 0   # the table holds what ran; a setting that did not is a finding
