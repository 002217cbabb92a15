"""The capabilities of a model family beyond its roles, one small interface each (``ModelFamily``
composes them). Every hook has a default that says "not provided" (an error naming the family and
the key) or "nothing" (None, an empty tuple); a family overrides the hooks it has."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from nvfp4stack.families.contract import FamilyIdentity, TensorGroup
from nvfp4stack.schemes import Scheme

# model.source_format values every family accepts: a BF16 checkpoint, and modelopt's NVFP4 export
# (routed experts NVFP4). A family adds its own release layouts (``source_formats``).
GENERIC_SOURCE_FORMATS = ("bf16", "modelopt")


class SupportsModels(FamilyIdentity):
    """Models the family builds.

    ``factories()``        ``{factory name: builder(cache_root: Path, source_format: str) -> checkpoint dir}``
                           for ``model.factory``; built once, then cached.
    ``shape_twins``        trained factory -> its seeded random twin (same headers, built in seconds).
    ``train(factory, cache_root, train_cfg)`` -> ``(dir, trained_now)`` for factories in ``trainable``.
    ``train_budgets``      trainable factory -> (default train.steps, what that budget took, measured).
    """

    shape_twins: dict[str, str] = {}
    trainable: tuple[str, ...] = ()
    train_budgets: dict[str, tuple[int, str]] = {}

    def factories(self) -> dict[str, Callable[[Path, str], Path]]:
        return {}

    def train(self, factory: str, cache_root: Path, train_cfg) -> tuple[Path, bool]:
        raise self.capability_missing("train", f"model.factory={factory!r}", "a factory listed in its trainable")


class SupportsCheckpointLayout(FamilyIdentity):
    """Checkpoint layouts and source formats.

    ``source_formats``     the family's own ``model.source_format`` values (release layouts), accepted
                           besides the generic ``GENERIC_SOURCE_FORMATS`` (bf16, modelopt).
    ``source_scheme(group, source_format)``  stored scheme of such a group (``model.source_format``);
                           the default answers the generic formats (modelopt: routed experts NVFP4).
    ``converter_modules``  modules whose import registers the family's own converters
                           (``@CONVERTERS.register``); imported with nvfp4stack.convert.
    ``served_config(src_config, groups)``  config.json for a converted checkpoint (fix-ups), or None
                           to copy the source's; ``groups``: the plan's GroupPlans (name, role, target,
                           converter).
    """

    source_formats: tuple[str, ...] = ()
    converter_modules: tuple[str, ...] = ()

    @property
    def accepted_source_formats(self) -> tuple[str, ...]:
        """The ``model.source_format`` values this family's models may have: generic, then its own."""
        return (*GENERIC_SOURCE_FORMATS, *self.source_formats)

    def source_scheme(self, group: TensorGroup, source_format: str):
        """Stored scheme of ``group`` in a generic source format: every matrix BF16, except the routed
        experts of a modelopt export (NVFP4); tensors that are no GEMM weight are kept as stored."""
        if source_format not in GENERIC_SOURCE_FORMATS:
            raise self.capability_missing(f"source_scheme for {source_format!r}", f"model.source_format={source_format!r}",
                                f"one of {', '.join(self.accepted_source_formats)}")
        if not group.is_matrix:
            return Scheme.PASSTHROUGH
        if source_format == "modelopt" and group.role == "routed_experts":
            return Scheme.NVFP4
        return Scheme.BF16

    def served_config(self, src_config: dict, groups: list) -> dict | None:
        """config.json of a converted checkpoint; ``groups``: the plan's GroupPlans (what each tensor
        group is converted to, ``converter`` None where it is copied as stored)."""
        return None


class SupportsPlanning(FamilyIdentity):
    """Planning from config.json alone, and the KV-cache plan.

    ``tensor_groups(hf)``  every ``TensorGroup`` from config.json alone (plans without weights), or None.
    ``mtp_layers(hf)``     the MTP layers config.json declares (the draft vLLM builds for
                           ``engine.speculative.method=mtp``, cached next to the model's); default 0.
    ``kv_cache(hf, kv_dtype, block_size, mtp_layers, tp, model_dtype)``  ``(stored dtype, [CacheLine])``
                           per GPU under ``tp`` tensor-parallel ranks, or None; ``model_dtype``: the dtype
                           the engine runs the model in (``engine.dtype``, auto resolved as vLLM does),
                           what ``kv_cache_dtype=auto`` stores unless vLLM's code for the family says otherwise.
    ``kv_pool_layers(hf, kv_dtype, block_size, mtp_layers)``  ``[plan.kv_pool.KVLayerSpec]`` in model
                           order where vLLM sizes the family's hybrid cache as a packed pool (its "GPU KV
                           cache size" and "Maximum concurrency" then follow ``plan.kv_pool``); default None.
    """

    def tensor_groups(self, hf: dict) -> Iterable[TensorGroup] | None:
        """Every tensor group from config.json alone (plans without weights); None: not supported."""
        return None

    def config_source_format(self, hf: dict) -> str | None:
        """The source format a weight-free config.json declares for ``tensor_groups`` (its quantization_config), so
        that a plan without weights cannot take another from model.source_format; None: none declared."""
        return None

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


class SupportsServing(FamilyIdentity):
    """What vLLM serves and how the plugin sits on it.

    ``vllm_quant_methods``   vLLM quantization methods of the family's own checkpoints that the plugin
                             may sit on (tried before plain fp8).
    ``vllm_tokenizer_modes`` vLLM ``--tokenizer-mode`` values the family adds.
    ``serve_checkpoint(cfg, plan, build)``  the dir vLLM serves for a factory model, or None;
                             ``serve_factories`` lists the factories it answers for.
    ``register_vllm(platform)``  what the family adds to vLLM in every process (the plugin calls it
                             with "cuda", "cpu", ...); nothing by default.
    """

    vllm_quant_methods: tuple[str, ...] = ()
    vllm_tokenizer_modes: tuple[str, ...] = ()
    serve_factories: tuple[str, ...] = ()

    def serve_checkpoint(self, cfg, plan, build: bool = True) -> Path | None:
        """The directory vLLM serves for ``cfg.model.factory``, or None when the family has none."""
        return None

    def register_vllm(self, platform: str) -> None:
        """Register the family's additions to vLLM in this process (vLLM's plugin hook); none by default."""


class SupportsDoctor(FamilyIdentity):
    """The doctor's family checks.

    ``check_checkpoint(config, tensors, report)``  family structure/config checks; returns True when the
                             checkpoint is in the layout vLLM loads (so the vLLM load check is worth running).
    ``vllm_load_check(ckpt, report, mode)``  vLLM's own loader on the checkpoint, optional.
    """

    def check_checkpoint(self, config: dict, tensors: dict, report) -> bool:
        """Family-specific doctor checks; True when the layout is the one vLLM loads."""
        return False

    def vllm_load_check(self, ckpt: Path, report, mode: str) -> None:
        """vLLM's own loader on ``ckpt`` (doctor); ``mode``: 'auto', 'on' or 'off'."""


class SupportsQuantize(FamilyIdentity):
    """The ``quantize`` pipeline.

    ``quantize(cfg)``      the ``quantize`` command for this family.
    ``export_formats``     the family's own ``quantize.export_format`` values -> the ``quantize.method``
                           values each supports (besides the generic ``hf_unified``, modelopt's
                           export_hf_checkpoint).
    """

    export_formats: dict[str, tuple[str, ...]] = {}

    def quantize(self, cfg) -> int:
        raise self.capability_missing("quantize", "quantize", "a family that has a quantize pipeline")


class SupportsReference(FamilyIdentity):
    """The reference forward (fidelity).

    ``eval_levels``        the ``eval.level`` values ``fidelity`` supports; the first is what
                           ``eval.level=auto`` (the default) runs.
    ``fidelity(cfg, seed)``  the ``eval`` metrics dict for one level.
    ``served_reference(bf16_dir, served_dir)``  fp32 torch model carrying the served weights (logprob
                           comparisons against a live server).
    """

    eval_levels: tuple[str, ...] = ()

    def fidelity(self, cfg, seed: int) -> dict:
        raise self.capability_missing("fidelity", f"eval.level={cfg.eval.level!r}", "a family with a reference forward")

    def served_reference(self, bf16_dir: Path, served_dir: Path):
        raise self.capability_missing("served_reference", str(bf16_dir), "a family with a reference forward")


class SupportsSynthetic(FamilyIdentity):
    """Random weights without a checkpoint on disk (engine benchmarks).

    ``synthetic_weights(config, seed, device)``  the checkpoint's tensors drawn per name, no files
                           (``engine.load_format=synthetic``).
    ``synthetic_checkpoint(root, experts, num_layers, max_position, drawn)``  a large random checkpoint for
                           engine benchmarks (bench.engine_model=synthetic), or its weight-free directory
                           (drawn, bench.engine_model=drawn).
    """

    def synthetic_checkpoint(self, root: Path, experts: str, num_layers: int, max_position: int,
                             drawn: bool = False) -> Path | None:
        """A large random checkpoint for engine benchmarks, built once under ``root``; None: none. ``drawn``: its
        config.json and tokenizer only, for ``synthetic_weights`` to draw the tensors at load."""
        return None

    def synthetic_weights(self, config: dict, seed: int, device, draft: bool = False):
        """(checkpoint name, tensor) for every tensor a checkpoint of ``config`` stores, in the layout
        of the family's first source format, drawn on ``device`` per tensor name: what
        ``engine.load_format=synthetic`` feeds vLLM's ``load_weights`` (engine/synthetic_loader.py).
        ``draft``: only the tensors vLLM's speculative draft (its MTP block) loads, with the same values."""
        raise self.capability_missing("synthetic weights", "engine.load_format=synthetic", "a family with synthetic_weights")
