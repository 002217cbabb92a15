"""ModelFamily: everything the core may ask of one model family.

A family lives in ``nvfp4stack/models/<family>/`` and exposes one ``ModelFamily`` instance as
``FAMILY`` in its ``__init__.py``; ``nvfp4stack/models/__init__.py`` lists the packages (one line
per family) and ``nvfp4stack/families/registry.py`` is the only way the core reaches a family.
Nothing outside ``models/`` names a family or one of its tensors; ``families/`` (this contract, the
registry, resolve) imports no plug-in and nothing that imports it back.

How to write a family (spec)
----------------------------
Subclass ``ModelFamily`` and set the class attributes; override a method only when the family has
that capability (the defaults say "not provided" in an error that names the family and the key).

Identity
  ``name``               the ``model.family`` value (conf/model/*.yaml), e.g. ``"qwen3_moe"``.
  ``hf_architectures``   config.json ``architectures`` values it serves (``Qwen3MoeForCausalLM``).
  ``model_types``        config.json ``model_type`` values (``qwen3_moe``).

Roles (what a precision key names; see ``GENERIC_ROLES`` and ``GENERIC_PATTERNS`` below)
  ``attn_roles``         attention projections as ``attn.<proj>`` roles; each one is the precision key
                         ``precision.attn.<proj>``. Use the projection's own short name.
  ``extra_roles``        family-only matrix roles, each a precision key (dotted = nested:
                         ``sparse.wq`` is ``precision.sparse.wq``).
  ``non_matrix_roles``   roles of stored tensors that are no GEMM weight (besides ``norms``).
  ``role_patterns``      ``(role, regex)`` tried on ``"." + tensor_or_module_name`` before the generic
                         patterns, first match wins. Cover every layout the family's names come in
                         (native, transformers, vLLM module prefixes).
  ``unquantized_roles``  matrix roles vLLM builds with ``quant_config=None``: the planner refuses any
                         target but bf16 for them; the doctor does not compare their served format.
  ``tp_sharded_roles``   roles vLLM splits across tensor-parallel ranks (memory plan); everything
                         else is counted replicated. Generic default: shared experts, embed, head.
  ``check_hard_rules``   family rules as ``PlanError`` (name the tensor, the role, the key and the fix).
  ``mtp_module``         the native multi-token-prediction module: its tensors are ``<mtp_module>.<N>.*``
                         (under any parent prefix). Generic default ``""``: the MTP layers are only the
                         decoder layers numbered past ``num_hidden_layers`` (transformers' and vLLM's
                         layout), which ``is_mtp`` counts for every family.
  ``gate_up_pairs``      a routed expert's (gate, up) projection names, one pair per layout the family's
                         checkpoints come in; the planner gives each pair one NVFP4 global scale (fused
                         gate_up kernels read one). Generic default: ``(("gate_proj", "up_proj"),)``.

Models
  ``factories()``        ``{factory name: builder(cache_root: Path, source_format: str) -> checkpoint dir}``
                         for ``model.factory``; built once, then cached.
  ``shape_twins``        trained factory -> its seeded random twin (same headers, built in seconds).
  ``train(factory, cache_root, train_cfg)`` -> ``(dir, trained_now)`` for factories in ``trainable``.
  ``train_budgets``      trainable factory -> (default train.steps, what that budget took, measured).

Planning
  ``tensor_groups(hf)``  every ``TensorGroup`` from config.json alone (plans without weights), or None.
  ``source_formats``     the family's own ``model.source_format`` values (release layouts), accepted
                         besides the generic ``GENERIC_SOURCE_FORMATS`` (bf16, modelopt).
  ``source_scheme(group, source_format)``  stored scheme of such a group (``model.source_format``);
                         the default answers the generic formats (modelopt: routed experts NVFP4).
  ``mtp_layers(hf)``     the MTP layers config.json declares (the draft vLLM builds for
                         ``engine.speculative.method=mtp``, cached next to the model's); default 0.
  ``kv_cache(hf, kv_dtype, block_size, mtp_layers, tp, model_dtype)``  ``(stored dtype, [CacheLine])``
                         per GPU under ``tp`` tensor-parallel ranks, or None; ``model_dtype``: the dtype
                         the engine runs the model in (``engine.dtype``, auto resolved as vLLM does),
                         what ``kv_cache_dtype=auto`` stores unless vLLM's code for the family says otherwise.
  ``kv_pool_layers(hf, kv_dtype, block_size, mtp_layers)``  ``[plan.kv_pool.KVLayerSpec]`` in model
                         order where vLLM sizes the family's hybrid cache as a packed pool (its "GPU KV
                         cache size" and "Maximum concurrency" then follow ``plan.kv_pool``); default None.

Checkpoints and vLLM
  ``converter_modules``                    modules whose import registers the family's own converters
                                           (``@CONVERTERS.register``); imported with nvfp4stack.convert.
  ``served_config(src_config, groups)``    config.json for a converted checkpoint (fix-ups), or None
                                           to copy the source's; ``groups``: the plan's GroupPlans
                                           (name, role, target, converter).
  ``check_checkpoint(config, tensors, report)``  family structure/config checks for the doctor;
                                           returns True when the checkpoint is in the layout vLLM
                                           loads (so the vLLM load check is worth running).
  ``vllm_load_check(ckpt, report, mode)``  vLLM's own loader on the checkpoint (doctor), optional.
  ``vllm_quant_methods``                   vLLM quantization methods of the family's own checkpoints
                                           that the plugin may sit on (tried before plain fp8).
  ``vllm_tokenizer_modes``                 vLLM ``--tokenizer-mode`` values the family adds.
  ``serve_checkpoint(cfg, plan, build)``   the dir vLLM serves for a factory model, or None;
                                           ``serve_factories`` lists the factories it answers for.
  ``synthetic_weights(config, seed, device)``  optional: the checkpoint's tensors drawn per name,
                            no files (``engine.load_format=synthetic``)
  ``synthetic_checkpoint(root, experts, num_layers, max_position)``  optional: a large random
                                           checkpoint for engine benchmarks (bench.engine_model=synthetic).
  ``quantize(cfg)``                        the ``quantize`` command for this family.
  ``export_formats``                       the family's own ``quantize.export_format`` values ->
                                           the ``quantize.method`` values each supports (besides
                                           the generic ``hf_unified``, modelopt's export_hf_checkpoint).

Fidelity
  ``eval_levels``         the ``eval.level`` values ``fidelity`` supports; the first is what
                          ``eval.level=auto`` (the default) runs.
  ``fidelity(cfg, seed)`` the ``eval`` metrics dict for one level.
  ``served_reference(bf16_dir, served_dir)``  fp32 torch model carrying the served weights (logprob
                          comparisons against a live server).

Keep heavy imports (torch, transformers, vllm, modelopt) inside methods: the registry imports every
family package to answer name lookups.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

# Roles every family shares; families add theirs (attn_roles, extra_roles, non_matrix_roles).
# Dotted roles form a tree: a rule naming 'attn' covers every 'attn.*' role. 'mtp.proj' (the MTP
# block's input projections) has no generic name: each family with MTP maps its own names to it.
GENERIC_ROLES = ("routed_experts", "shared_experts", "dense_mlp", "gate", "gate.bias",
                 "embed", "head", "mtp.proj", "norms")
# Precision keys of the generic matrix roles (precision.<role>).
GENERIC_PRECISION_ROLES = ("routed_experts", "shared_experts", "dense_mlp", "gate", "embed", "head")

# Generic name -> role patterns: transformers' and vLLM's MoE layout (model.layers.N.mlp.*,
# embed_tokens, lm_head), tried after the family's own (first match wins). A family whose names
# differ (another module name, projection names, router bias, MTP) adds them to its role_patterns.
GENERIC_PATTERNS: tuple[tuple[str, str], ...] = (
    ("shared_experts", r"\.mlp\.shared_experts?(\.|$)"),
    ("routed_experts", r"\.mlp\.experts(\.|$)"),
    ("dense_mlp", r"\.mlp\.(gate_proj|up_proj|down_proj|gate_up_proj)(\.|$)"),
    ("gate.bias", r"\.mlp\.gate\.bias$"),
    ("gate", r"\.mlp\.gate(\.weight|$)"),
    ("embed", r"(^|\.)embed_tokens(\.weight)?$"),
    ("head", r"(^|\.)lm_head(\.weight)?$"),
    ("norms", r"norm(\.weight|\.bias)?$|layernorm(\.weight)?$"),
)

# model.source_format values every family accepts: a BF16 checkpoint, and modelopt's NVFP4 export
# (routed experts NVFP4). A family adds its own release layouts (ModelFamily.source_formats).
GENERIC_SOURCE_FORMATS = ("bf16", "modelopt")

# A decoder layer's number in any layout ('layers.3.', 'model.layers.3.').
_DECODER_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


@lru_cache(maxsize=None)
def _mtp_module_pattern(module: str) -> re.Pattern:
    """``<module>.<N>.`` under any parent prefix."""
    return re.compile(rf"(^|\.){re.escape(module)}\.\d+\.")


@dataclass(frozen=True)
class TensorGroup:
    """One logical weight (``layers.3.ffn.experts.17.w1``); its stored tensors depend on the format."""

    name: str                 # prefix without the '.weight' suffix for matrices
    shape: tuple[int, ...]    # logical [out_features, in_features] for matrices
    role: str                 # a generic role or one the family declares
    mtp: bool = False         # part of the multi-token-prediction block
    dtype: str = "bf16"       # logical (unquantized) dtype: bf16, f32 or i64
    is_matrix: bool = True    # a GEMM weight that a quantization scheme can apply to

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class FamilyCapabilityError(ValueError):
    """A command asked a family for something it does not provide."""


class ModelFamily:
    """Base class of a model family; see the module docstring for the contract."""

    name: str = ""
    hf_architectures: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()
    attn_roles: tuple[str, ...] = ()
    extra_roles: tuple[str, ...] = ()
    non_matrix_roles: tuple[str, ...] = ()
    role_patterns: tuple[tuple[str, str], ...] = ()
    unquantized_roles: tuple[str, ...] = ()
    tp_sharded_roles: tuple[str, ...] = ("shared_experts", "embed", "head")
    gate_up_pairs: tuple[tuple[str, str], ...] = (("gate_proj", "up_proj"),)
    source_formats: tuple[str, ...] = ()
    mtp_module: str = ""
    shape_twins: dict[str, str] = {}
    trainable: tuple[str, ...] = ()
    train_budgets: dict[str, tuple[int, str]] = {}
    export_formats: dict[str, tuple[str, ...]] = {}
    converter_modules: tuple[str, ...] = ()
    vllm_quant_methods: tuple[str, ...] = ()
    vllm_tokenizer_modes: tuple[str, ...] = ()
    serve_factories: tuple[str, ...] = ()
    eval_levels: tuple[str, ...] = ()

    # -- roles -------------------------------------------------------------------------------
    @property
    def roles(self) -> tuple[str, ...]:
        """Every role this family's tensors can have."""
        return (*GENERIC_ROLES, *self.attn_roles, *self.extra_roles, *self.non_matrix_roles)

    @property
    def precision_roles(self) -> tuple[str, ...]:
        """The precision keys (flat, dotted) that name one of this family's matrix roles."""
        return (*GENERIC_PRECISION_ROLES, *self.attn_roles, *self.extra_roles)

    def compiled_patterns(self) -> list[tuple[str, re.Pattern]]:
        """The family's own patterns, then the generic ones, compiled once per family."""
        cached = self.__dict__.get("_compiled")
        if cached is None:
            cached = [(r, re.compile(p)) for r, p in (*self.role_patterns, *GENERIC_PATTERNS)]
            self.__dict__["_compiled"] = cached
        return cached

    def role_of(self, name: str) -> str | None:
        """The role of a tensor or module name in any layout of this family, or None."""
        probe = "." + name
        for role, pat in self.compiled_patterns():
            if pat.search(probe):
                return role
        return None

    def is_mtp(self, name: str, num_hidden_layers: int | None = None) -> bool:
        """True for a multi-token-prediction tensor or module name: under the family's ``mtp_module``
        (``mtp.0.ffn...``), or a decoder layer numbered ``num_hidden_layers`` or higher."""
        if self.mtp_module and _mtp_module_pattern(self.mtp_module).search(name):
            return True
        if num_hidden_layers is None:
            return False
        m = _DECODER_LAYER.search(name)
        return bool(m) and int(m.group(2)) >= num_hidden_layers

    def check_hard_rules(self, group: TensorGroup, source, target) -> None:
        """Raise ``PlanError`` when storing ``group`` as ``target`` breaks a rule of this family."""

    # -- models ------------------------------------------------------------------------------
    def factories(self) -> dict[str, Callable[[Path, str], Path]]:
        return {}

    def train(self, factory: str, cache_root: Path, train_cfg) -> tuple[Path, bool]:
        raise self._missing("train", f"model.factory={factory!r}", "a factory listed in its trainable")

    # -- planning ----------------------------------------------------------------------------
    def tensor_groups(self, hf: dict) -> Iterable[TensorGroup] | None:
        """Every tensor group from config.json alone (plans without weights); None: not supported."""
        return None

    @property
    def accepted_source_formats(self) -> tuple[str, ...]:
        """The ``model.source_format`` values this family's models may have: generic, then its own."""
        return (*GENERIC_SOURCE_FORMATS, *self.source_formats)

    def source_scheme(self, group: TensorGroup, source_format: str):
        """Stored scheme of ``group`` in a generic source format: every matrix BF16, except the routed
        experts of a modelopt export (NVFP4); tensors that are no GEMM weight are kept as stored."""
        from nvfp4stack.schemes import Scheme

        if source_format not in GENERIC_SOURCE_FORMATS:
            raise self._missing(f"source_scheme for {source_format!r}", f"model.source_format={source_format!r}",
                                f"one of {', '.join(self.accepted_source_formats)}")
        if not group.is_matrix:
            return Scheme.PASSTHROUGH
        if source_format == "modelopt" and group.role == "routed_experts":
            return Scheme.NVFP4
        return Scheme.BF16

    def mtp_layers(self, hf: dict) -> int:
        """How many multi-token-prediction layers config.json ``hf`` declares; 0: the family has none."""
        return 0

    def kv_cache(self, hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int, tp: int = 1,
                 model_dtype: str | None = None):
        """``(stored dtype, [CacheLine])`` per GPU for the plan's KV section, or None (no KV section);
        ``tp``: tensor-parallel ranks (attention with several KV heads splits them over the ranks);
        ``model_dtype``: the dtype the engine runs the model in (None: config.json's, as vLLM's
        ``--dtype auto`` picks it; ``plan.kv_cache.model_dtype``)."""
        return None

    def kv_pool_layers(self, hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int):
        """Every cache layer vLLM registers, as ``plan.kv_pool.KVLayerSpec`` in model order, for a family
        whose hybrid cache vLLM packs into one pool; None: vLLM sizes it by bytes per token."""
        return None

    # -- checkpoints, vLLM -------------------------------------------------------------------
    def served_config(self, src_config: dict, groups: list) -> dict | None:
        """config.json of a converted checkpoint; ``groups``: the plan's GroupPlans (what each tensor
        group is converted to, ``converter`` None where it is copied as stored)."""
        return None

    def check_checkpoint(self, config: dict, tensors: dict, report) -> bool:
        """Family-specific doctor checks; True when the layout is the one vLLM loads."""
        return False

    def vllm_load_check(self, ckpt: Path, report, mode: str) -> None:
        """vLLM's own loader on ``ckpt`` (doctor); ``mode``: 'auto', 'on' or 'off'."""

    def serve_checkpoint(self, cfg, plan, build: bool = True) -> Path | None:
        """The directory vLLM serves for ``cfg.model.factory``, or None when the family has none."""
        return None

    def synthetic_checkpoint(self, root: Path, experts: str, num_layers: int, max_position: int) -> Path | None:
        """A large random checkpoint for engine benchmarks, built once under ``root``; None: none."""
        return None

    def synthetic_weights(self, config: dict, seed: int, device):
        """(checkpoint name, tensor) for every tensor a checkpoint of ``config`` stores, in the layout
        of the family's first source format, drawn on ``device`` per tensor name: what
        ``engine.load_format=synthetic`` feeds vLLM's ``load_weights`` (engine/synthetic_loader.py)."""
        raise self._missing("synthetic weights", "engine.load_format=synthetic", "a family with synthetic_weights")

    def quantize(self, cfg) -> int:
        raise self._missing("quantize", "quantize", "a family that has a quantize pipeline")

    # -- fidelity ----------------------------------------------------------------------------
    def fidelity(self, cfg, seed: int) -> dict:
        raise self._missing("fidelity", f"eval.level={cfg.eval.level!r}", "a family with a reference forward")

    def served_reference(self, bf16_dir: Path, served_dir: Path):
        raise self._missing("served_reference", str(bf16_dir), "a family with a reference forward")

    # -- helpers -----------------------------------------------------------------------------
    def _missing(self, what: str, key: str, expected: str) -> FamilyCapabilityError:
        return FamilyCapabilityError(
            f"{key}: model family {self.name!r} provides no {what}; expected {expected}. Fix: pick a "
            f"model of a family that has it, or add {what} to nvfp4stack/models/{self.name}/")

    def __repr__(self) -> str:
        return f"<model family {self.name}>"
