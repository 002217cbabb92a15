"""``serve``: vLLM's OpenAI server for the recipe, as a health-checked child process.

The embedded default (recipe tiny_cpu) builds its family's tiny model on first use, quantizes
its routed experts to NVFP4 with modelopt (``ModelFamily.serve_checkpoint``), and serves it
through the plugin's torch_emulation MoE path. ``engine.dry_run=true`` prints the exact command line and exits.

Exit codes as README "Exit codes": 130 when Ctrl-C (or SIGTERM) stops it, before or after ready; 1
when the plan finds NOTHING FITS (as ``plan``) or the server fails; 2 for a config error.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from nvfp4stack.cli import EXIT_INTERRUPTED, EXIT_PROBLEMS
from nvfp4stack.engine.args import SYNTHETIC, format_cli, server_argv
from nvfp4stack.engine.compat import draft_prompt_logprobs_warning
from nvfp4stack.engine.config import VLLM_KEY_ENV
from nvfp4stack.engine.plan_section import SECTION_KEY, EnginePlan, engine_plan_for, load_time_refusal
from nvfp4stack.plan.build import kv_cache_for_config, plan_for_config
from nvfp4stack.plan.kv_cache import nothing_fits
from nvfp4stack.plan.preflight import host_mismatch

# vLLM on CPU reserves this much KV cache by default (4 GiB); the tiny model needs far less and
# the CI machines are shared.
CPU_DEFAULT_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
BIND_KEY = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_thread_binding(workers: int, cpus: list[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``workers`` CPU workers: the allowed cores in equal
    contiguous groups ("0|1", "0,1,2,3|4,5,6,7"), leftovers unused.

    vLLM's own "auto" binding wants one NUMA node per worker and refuses several workers on a
    one-node host ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers").
    """
    cpus = sorted(cpus)
    if workers > len(cpus):
        raise ValueError(f"engine.tp x engine.dp = {workers} CPU workers need a core each, but this process may "
                         f"use {len(cpus)} ({cpus}); lower engine.tp / engine.dp, or set engine.env."
                         f"{BIND_KEY} yourself")
    per = len(cpus) // workers
    return "|".join(",".join(map(str, cpus[i * per:(i + 1) * per])) for i in range(workers))


def api_key(engine) -> tuple[str | None, str | None]:
    """(name of the environment variable holding the server's API key, the key), or (None, None)
    when the server takes requests without one.

    ``engine.api_key_env`` names the variable. Without it, a VLLM_API_KEY already in this
    environment still reaches vLLM (the child inherits it), so serve knows the server needs it.
    """
    name = engine.api_key_env
    if name is None:
        key = os.environ.get(VLLM_KEY_ENV)
        return (VLLM_KEY_ENV, key) if key else (None, None)
    key = os.environ.get(name, "")
    if not key.strip():
        raise ValueError(
            f"engine.api_key_env={name}: expected the API key in environment variable {name}, found it "
            f"{'empty' if name in os.environ else 'unset'}. Fix: export {name}=<key> (e.g. export {name}=$(openssl "
            "rand -hex 24)) in the shell that runs serve, or engine.api_key_env=null to serve without a key")
    return name, key


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` takes connections from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False   # a host name: it may resolve to any interface


def server_env(cfg, key: str | None = None) -> dict[str, str]:
    """Environment the server starts with: on CPU the KV-cache default and, for several workers
    (tensor/data parallel) with no binding of the user's, one core group per worker; then ``engine.env``;
    then the API key (``key``) as VLLM_API_KEY, which vLLM's OpenAI server reads."""
    env: dict[str, str] = {}
    workers = cfg.engine.tp * cfg.engine.dp
    if cfg.arch.name == "cpu":
        env.update(CPU_DEFAULT_ENV)
        if workers > 1 and BIND_KEY not in os.environ and BIND_KEY not in cfg.engine.env:
            env[BIND_KEY] = cpu_thread_binding(workers, list(os.sched_getaffinity(0)))
            print(f"[serve] {workers} CPU workers: {BIND_KEY}={env[BIND_KEY]} (set engine.env.{BIND_KEY} to "
                  "choose)", flush=True)
    env.update(cfg.engine.env)
    if key:
        env[VLLM_KEY_ENV] = key
    return env


def resolve_checkpoint(cfg, plan: EnginePlan, *, build: bool = True) -> Path:
    """The directory vLLM loads: model.path, the factory's cached build, or (engine.load_format=synthetic)
    a weight-free directory whose weights the plugin draws at load."""
    if cfg.engine.load_format == SYNTHETIC:
        from nvfp4stack.models.synthetic_dir import synthetic_model_dir

        return synthetic_model_dir(cfg.model, cfg.cache_dir)
    if cfg.model.path:
        return Path(cfg.model.path).expanduser()
    from nvfp4stack.families.registry import get_factory, servable_factories

    if cfg.model.factory:
        ckpt = get_factory(cfg.model.factory)[0].serve_checkpoint(cfg, plan, build=build)
        if ckpt is not None:
            return ckpt
    if not build:
        # dry run of a weight-free recipe (a descriptor on a laptop): show where the path goes
        return Path(f"/path/to/{cfg.model.name}-checkpoint")
    raise FileNotFoundError(
        f"serve: model {cfg.model.name!r} has no checkpoint: model.path is unset and model.factory="
        f"{cfg.model.factory!r} is not one serve can build ({', '.join(servable_factories())}); set model.path=<dir> "
        "(e.g. the output of `quantize`)"
    )


def refuse_source_as_is(planned) -> None:
    """A plan whose source checkpoint cannot be served as it is (engine/plan_section.load_time_refusal)."""
    from nvfp4stack.plan.planner import PlanError

    why = load_time_refusal(planned)
    if why:
        raise PlanError(why)


def check_plugin_installed() -> None:
    """vLLM loads plugins from installed distributions' entry points: a source tree on PYTHONPATH
    alone has none, and vLLM would then quietly serve the checkpoint with its own kernels."""
    from importlib.metadata import entry_points

    if not any(ep.name == "nvfp4stack" for ep in entry_points(group="vllm.general_plugins")):
        raise FileNotFoundError(
            "serve: the plan runs modules on nvfp4stack kernels, but vLLM will not load the nvfp4stack plugin: "
            "no 'vllm.general_plugins' entry point named nvfp4stack is installed (nvfp4stack on PYTHONPATH "
            "is not enough). Fix: pip install -e . (install.sh does), or on an offline host "
            "`pip install --no-deps --no-build-isolation --target SITE .`")


def build_argv(cfg, plan: EnginePlan, ckpt: Path) -> list[str]:
    served = cfg.model.served_name or cfg.model.name
    if plan.needs_plugin() and not (ckpt / "config.json").exists():
        if not cfg.engine.dry_run:
            raise FileNotFoundError(f"serve: {ckpt}/config.json is missing; model.path must be a HF checkpoint")
        # Dry run without the checkpoint: show the plan section; the checkpoint's own
        # quantization_config is merged into it at launch.
        argv = server_argv(cfg.engine, model=str(ckpt), served_name=served, plan=EnginePlan({}))
        return argv + ["--quantization", "nvfp4stack", "--hf-overrides",
                       json.dumps({"quantization_config": {SECTION_KEY: plan.to_dict(),
                                                           "...": f"<quantization_config of {ckpt}>"}})]
    return server_argv(cfg.engine, model=str(ckpt), served_name=served, plan=plan)


@contextlib.contextmanager
def serving(cfg, *, log_name: str = "vllm_server.log"):
    """The recipe's server, started like ``serve`` does (plan, checkpoint, argv, env), for a caller
    that measures it (benchmarks): yields (base_url, model_id, ready_s, argv, checkpoint dir) once
    /v1/models lists the model, and stops the whole process tree on exit."""
    from nvfp4stack.engine import server

    engine = cfg.engine
    _, key = api_key(engine)
    planned = plan_for_config(cfg)
    refuse_source_as_is(planned)
    plan = engine_plan_for(cfg, planned)
    ckpt = resolve_checkpoint(cfg, plan, build=True)
    argv = build_argv(cfg, plan, ckpt)
    if plan.needs_plugin() or engine.load_format == SYNTHETIC:
        check_plugin_installed()
    env = server_env(cfg, key)
    log_path = Path(cfg.run_dir) / log_name
    base_url = f"http://{engine.host}:{engine.port}/v1"
    server.check_port_free(engine.host, engine.port)
    t0 = time.monotonic()
    proc = server.launch(argv, log_path, env)
    try:
        models = server.wait_ready(proc, base_url, engine.ready_timeout_s, log_path, api_key=key)
        yield base_url, models[0], time.monotonic() - t0, argv, ckpt
    finally:
        left = server.shutdown(proc)
        if left:
            raise RuntimeError(f"serve: server processes still alive after shutdown: {left} (log {log_path})")


def run(cfg) -> int:
    from nvfp4stack.engine import server

    engine = cfg.engine
    mismatch = None if engine.dry_run else host_mismatch(cfg.recipe, cfg.arch.name)
    if mismatch:
        print(f"nvfp4stack serve: {mismatch}", file=sys.stderr)
        return 2
    key_env, key = api_key(engine)   # a named variable that is unset: ValueError, exit 2
    if not key and not is_loopback(engine.host):
        print(f"[serve] WARNING: engine.host={engine.host} takes connections from other machines and the server "
              "asks them for no API key; set engine.api_key_env=NAME (an environment variable holding a key), "
              "or engine.host=127.0.0.1", file=sys.stderr, flush=True)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    planned = plan_for_config(cfg)   # the planner's decisions; raises PlanError/BackendError like `plan`
    refuse_source_as_is(planned)
    plan = engine_plan_for(cfg, planned)
    too_big = nothing_fits(kv_cache_for_config(cfg, planned))   # `plan`'s exit-1 finding
    if too_big and not engine.allow_overcommit:
        print(f"serve: {too_big}; or set engine.allow_overcommit=true to serve anyway", file=sys.stderr)
        return EXIT_PROBLEMS
    if too_big:
        print(f"[serve] WARNING: {too_big}; serving anyway (engine.allow_overcommit=true)", file=sys.stderr)
    draft_note = draft_prompt_logprobs_warning(engine, cfg.arch.name)
    if draft_note:
        print(f"[serve] WARNING: {draft_note}", file=sys.stderr, flush=True)
    ckpt = resolve_checkpoint(cfg, plan, build=not engine.dry_run)
    argv = build_argv(cfg, plan, ckpt)
    if (plan.needs_plugin() or engine.load_format == SYNTHETIC) and not engine.dry_run:
        check_plugin_installed()
    cli = format_cli(argv)
    (run_dir / "serve_command.sh").write_text(cli + "\n")
    (run_dir / "engine_plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    if engine.dry_run:
        print(cli)
        return 0

    env = server_env(cfg, key)
    log_path = run_dir / "vllm_server.log"
    base_url = f"http://{engine.host}:{engine.port}/v1"
    server.check_port_free(engine.host, engine.port)
    print(f"[serve] {cli}\n[serve] log: {log_path}", flush=True)
    t0 = time.monotonic()
    proc = server.launch(argv, log_path, env)

    stop = StopFlag()
    old = {s: signal.signal(s, stop.set) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        models = _wait_ready_or_stop(server, proc, base_url, engine.ready_timeout_s, log_path, stop, key)
        if models is None:
            return EXIT_INTERRUPTED
        print(f"[serve] engine ready in {time.monotonic() - t0:.1f} s", flush=True)
        print(server.ready_message(base_url, models[0], key_env), flush=True)
        while not stop.is_set():
            if proc.poll() is not None:
                print(f"[serve] server exited with code {proc.returncode}; log tail:\n"
                      f"{server.log_tail(log_path)}", file=sys.stderr)
                return proc.returncode or 1
            stop.wait(1.0)
        return EXIT_INTERRUPTED   # README "Exit codes": Ctrl-C is 130, before and after ready alike
    except server.ServerError as e:
        print(f"[serve] {e}", file=sys.stderr)
        return 1
    finally:
        left = server.shutdown(proc)
        for s, h in old.items():
            signal.signal(s, h)
        still = f"; processes still alive: {left}" if left else ""
        if stop.is_set():
            print(f"nvfp4stack serve: interrupted ({stop.name()}): server and its processes stopped{still}",
                  file=sys.stderr, flush=True)
        else:
            print(f"[serve] stopped{still}", flush=True)


class StopFlag:
    """Set by the SIGINT/SIGTERM handler, polled by serve's loops.

    Not a threading.Event: Event.set() takes the event's lock, and a signal handled while the main
    thread holds that lock inside Event.wait() deadlocks the process (the server is then never
    stopped). Setting a plain attribute takes no lock.
    """

    def __init__(self) -> None:
        self.hit = False
        self.signum: int | None = None

    def set(self, signum=None, _frame=None) -> None:
        self.hit = True
        self.signum = signum

    def name(self) -> str:
        """What stopped it, for the one line serve prints."""
        return "Ctrl-C" if self.signum in (None, signal.SIGINT) else signal.Signals(self.signum).name

    def is_set(self) -> bool:
        return self.hit

    def wait(self, timeout: float) -> bool:
        """Sleep until set or ``timeout`` seconds have passed; whether it is set."""
        end = time.monotonic() + timeout
        while not self.hit and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return self.hit


def _wait_ready_or_stop(server, proc, base_url, timeout_s, log_path, stop, api_key=None):
    """wait_ready, but a Ctrl-C during engine start returns None instead of waiting it out."""
    result: dict = {}

    def target():
        try:
            result["models"] = server.wait_ready(proc, base_url, timeout_s, log_path, api_key=api_key)
        except server.ServerError as e:
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    while t.is_alive():
        if stop.is_set():
            return None
        t.join(0.5)
    if "error" in result:
        raise result["error"]
    return result["models"]
