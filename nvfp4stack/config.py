"""Typed configuration: the schema of every config group, registered with Hydra in one place.

Task functions receive a ``RootConfig`` instance (``to_object``'d), never a DictConfig, and never
import Hydra. Unknown keys are rejected by OmegaConf's structured-config merge.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass

from nvfp4stack.bench.config import BenchConfig
from nvfp4stack.convert.config import ConvertConfig
from nvfp4stack.engine.config import EngineConfig
from nvfp4stack.eval.config import EvalConfig
from nvfp4stack.families.registry import get_family, precision_keys
from nvfp4stack.models import DEFAULT_MODEL
from nvfp4stack.plan.rules import PrecisionRule
from nvfp4stack.quantize.config import QuantizeConfig
from nvfp4stack.schemes import Scheme
from nvfp4stack.train.config import TrainConfig
from nvfp4stack.usage import COMMANDS, did_you_mean


def _check_choice(key: str, value: str, valid: tuple[str, ...] | list[str]) -> None:
    if value not in valid:
        raise ValueError(f"{key}={value!r} is not valid; expected one of: {', '.join(valid)}"
                         f"{did_you_mean(value, valid, f'{key}=')}")


@dataclass
class ModelConfig:
    """What model, and where its config and weights are.

    ``descriptor``: a config.json shipped in nvfp4stack/models/descriptors (planning without
    weights); ``factory``: a tiny model built locally on first use; ``path``: a checkpoint dir.
    """

    name: str = DEFAULT_MODEL["name"]
    family: str = DEFAULT_MODEL["family"]   # a registered model family (nvfp4stack/families/registry.py)
    descriptor: str | None = None
    factory: str | None = DEFAULT_MODEL["factory"]
    path: str | None = None
    source_format: str = "bf16"   # bf16 | modelopt | one the family declares (ModelFamily.source_formats)
    served_name: str | None = None
    # Decoder layers kept of a weight-free descriptor (planning, engine.load_format=synthetic): full width,
    # reduced depth (the MTP block stays). None keeps the model's own; a checkpoint has its own depth.
    num_layers: int | None = None

    def __post_init__(self) -> None:
        family = get_family(self.family)  # the error lists the registered families
        if self.source_format not in family.accepted_source_formats:
            valid = family.accepted_source_formats
            raise ValueError(
                f"model.source_format={self.source_format!r} is not a source format of model family "
                f"{family.name!r}: expected one of {', '.join(valid)}, found {self.source_format!r}. Fix: set "
                f"model.source_format={valid[0]} (or another of those), or a model of a family that stores "
                f"{self.source_format!r} (ModelFamily.source_formats in nvfp4stack/models/<family>/)")
        if self.num_layers is not None and (self.num_layers < 1 or self.path or not self.descriptor):
            found = (f"model.path={self.path!r}" if self.path else "a count below 1" if self.num_layers < 1
                     else f"model {self.name!r} without a descriptor")
            raise ValueError(
                f"model.num_layers={self.num_layers!r}: expected a positive layer count for a weight-free descriptor "
                f"(model.descriptor), found {found}; a checkpoint's depth is its own. Fix: drop model.num_layers, or "
                "plan/serve a descriptor model (one with model.descriptor; engine.load_format=synthetic to serve it)")
        if not (self.descriptor or self.factory or self.path):
            raise ValueError(
                f"model {self.name!r}: none of model.descriptor, model.factory, model.path is set; "
                "set model.path=<checkpoint dir> or pick a model from conf/model/"
            )


@dataclass
class ArchConfig:
    """Target GPU architecture (``auto`` detects the local one) and its memory per GPU."""

    name: str = "auto"
    gpu_memory_gb: float = 0.0   # decimal GB per GPU, for the memory planner; 0 = unknown
    # what vLLM keeps per GPU beyond weights and KV cache (its memory profile: activations at
    # max_num_batched_tokens, the CUDA-graph estimate for the captured sizes, NCCL), in decimal GB; it
    # depends on the serving settings as much as on the GPU. The planner takes it off the KV budget. 0 = not modeled
    runtime_reserve_gb: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        from nvfp4stack.arch import KNOWN_ARCHS

        _check_choice("arch.name", self.name, ["auto", *KNOWN_ARCHS])
        if not self.runtime_reserve_gb >= 0:
            raise ValueError(f"arch.runtime_reserve_gb={self.runtime_reserve_gb!r}: expected GB >= 0 (what vLLM keeps "
                             "per GPU beyond weights and KV cache). Fix: set it to 0 or a measured figure")


_NOT_ROLES = ("mtp", "fp8_scale_fmt", "rules")


@dataclass
class _PrecisionBase:
    """Target scheme per module role. ``passthrough`` keeps the checkpoint's own format.

    ``rules`` come first and the first matching rule wins (llm-compressor targets/ignore,
    ``re:`` regexes and globs); then ``mtp`` (unless ``inherit``) for the MTP block; then the
    per-role fields: the generic roles below plus the attention projections (``attn.<proj>``) and
    extra roles the model families declare (nvfp4stack/models/<family>/family.py).
    """

    routed_experts: str = "nvfp4"
    shared_experts: str = "passthrough"
    dense_mlp: str = "passthrough"
    gate: str = "passthrough"
    embed: str = "passthrough"
    head: str = "passthrough"
    mtp: str = "passthrough"          # passthrough = MTP untouched; inherit = follow the roles
    fp8_scale_fmt: str = "ue8m0"      # fp8_block scales: ue8m0 (DeepGEMM) or fp32
    rules: list[PrecisionRule] = field(default_factory=list)

    def __post_init__(self) -> None:
        schemes = Scheme.names()  # read here: a storage codec may register its scheme after import
        for key, value in self.role_schemes().items():
            _check_choice(f"precision.{key}", value, schemes)
        _check_choice("precision.mtp", self.mtp, [*schemes, "inherit"])
        _check_choice("precision.fp8_scale_fmt", self.fp8_scale_fmt, ("ue8m0", "fp32"))

    def role_schemes(self) -> dict[str, str]:
        """Flat role -> scheme map ('routed_experts' -> 'nvfp4', 'attn.<proj>' -> 'fp8_block', ...)."""
        flat: dict[str, str] = {}
        for f in fields(self):
            if f.name in _NOT_ROLES:
                continue
            value = getattr(self, f.name)
            if is_dataclass(value):
                flat.update({f"{f.name}.{k}": v for k, v in vars(value).items()})
            else:
                flat[f.name] = value
        return flat

    def foreign_keys(self, family) -> dict[str, str]:
        """Keys set to a scheme that name no role of ``family`` (a ModelFamily): they select nothing."""
        own = set(family.precision_roles)
        return {k: v for k, v in self.role_schemes().items() if v != "passthrough" and k not in own}


def _precision_schema() -> type:
    """PrecisionConfig: the generic roles plus every registered family's precision keys, dotted keys
    as nested groups (``attn.<proj>`` -> ``precision.attn.<proj>``), each defaulting to passthrough."""
    top: list[str] = []
    nested: dict[str, list[str]] = {}
    for key in precision_keys():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, []).append(rest)
        else:
            top.append(key)
    extra: list[tuple] = [(k, str, field(default="passthrough")) for k in top]
    for head, names in nested.items():
        group = make_dataclass(f"{head.capitalize()}Precision", [(n, str, field(default="passthrough")) for n in names])
        group.__module__ = __name__
        GROUP_PRECISIONS[head] = group
        extra.append((head, group, field(default_factory=group)))
    cls = make_dataclass("PrecisionConfig", extra, bases=(_PrecisionBase,))
    cls.__module__ = __name__
    cls.__doc__ = _PrecisionBase.__doc__
    return cls


# Nested precision groups by key ('attn' -> its dataclass), filled by _precision_schema.
GROUP_PRECISIONS: dict[str, type] = {}
PrecisionConfig = _precision_schema()


@dataclass
class BackendConfig:
    """Kernel backend per layer kind: a registered name, or auto (per-arch priority list)."""

    moe: str = "auto"
    linear: str = "auto"
    mtp_moe: str = "auto"   # the MTP draft's routed experts (vLLM speculative_config.moe_backend)
    # triton_w4a16 only: keep an FP8 copy of the routed experts (+1 byte/weight, built at load) and
    # run calls with >= 64 routed rows per expert on FP8 tensor cores (sm90+; bench/RESULTS.md)
    moe_fp8_prefill: bool = False


@dataclass
class RootConfig:
    command: str = "plan"
    recipe: str = "tiny_cpu"
    model: ModelConfig = field(default_factory=ModelConfig)
    arch: ArchConfig = field(default_factory=ArchConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    quantize: QuantizeConfig = field(default_factory=QuantizeConfig)
    convert: ConvertConfig = field(default_factory=ConvertConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: str | None = None       # a checkpoint to inspect (doctor) or to start from
    run_dir: str = "outputs/run"
    cache_dir: str = "~/.cache/nvfp4stack"

    def __post_init__(self) -> None:
        _check_choice("command", self.command, COMMANDS)


GROUPS: dict[str, type] = {
    "model": ModelConfig, "arch": ArchConfig, "precision": PrecisionConfig,
    "backend": BackendConfig, "engine": EngineConfig, "quantize": QuantizeConfig,
    "convert": ConvertConfig, "eval": EvalConfig, "bench": BenchConfig, "train": TrainConfig,
}


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (called by the CLI shim only)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="root_schema", node=RootConfig)
    for group, cls in GROUPS.items():
        cs.store(group=group, name=f"{group}_schema", node=cls)
