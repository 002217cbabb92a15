"""Typed configuration: the schema of every config group, registered with Hydra in one place.

Task functions receive a ``RootConfig`` instance (``to_object``'d), never a DictConfig, and never
import Hydra. Unknown keys are rejected by OmegaConf's structured-config merge.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from nvfp4stack.bench.config import BenchConfig
from nvfp4stack.convert.config import ConvertConfig
from nvfp4stack.engine.config import EngineConfig
from nvfp4stack.eval.config import EvalConfig
from nvfp4stack.plan.rules import PrecisionRule
from nvfp4stack.quantize.config import QuantizeConfig
from nvfp4stack.schemes import Scheme
from nvfp4stack.train.config import TrainConfig

COMMANDS = ("plan", "quantize", "convert", "serve", "eval", "bench", "doctor", "train")
SOURCE_FORMATS = ("bf16", "official", "modelopt")
FAMILIES = ("deepseek_v4", "deepseek_v3")


def _check_choice(key: str, value: str, valid: tuple[str, ...] | list[str]) -> None:
    if value not in valid:
        raise ValueError(f"{key}={value!r} is not valid; expected one of: {', '.join(valid)}")


@dataclass
class ModelConfig:
    """What model, and where its config and weights are.

    ``descriptor``: a config.json shipped in nvfp4stack/models/descriptors (planning without
    weights); ``factory``: a tiny model built locally on first use; ``path``: a checkpoint dir.
    """

    name: str = "tiny_v3"
    family: str = "deepseek_v3"
    descriptor: str | None = None
    factory: str | None = "tiny_v3"
    path: str | None = None
    source_format: str = "bf16"   # bf16 | official (FP8 attn + MXFP4 experts) | modelopt
    served_name: str | None = None

    def __post_init__(self) -> None:
        _check_choice("model.family", self.family, FAMILIES)
        _check_choice("model.source_format", self.source_format, SOURCE_FORMATS)
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
    description: str = ""

    def __post_init__(self) -> None:
        from nvfp4stack.arch import KNOWN_ARCHS

        _check_choice("arch.name", self.name, ["auto", *KNOWN_ARCHS])


_SCHEMES = [s.value for s in Scheme]


@dataclass
class AttnPrecision:
    wq_a: str = "passthrough"
    wq_b: str = "passthrough"
    wkv: str = "passthrough"
    wkv_b: str = "passthrough"
    wo_a: str = "passthrough"
    wo_b: str = "passthrough"


@dataclass
class IndexerPrecision:
    wq_b: str = "passthrough"
    weights_proj: str = "passthrough"


@dataclass
class PrecisionConfig:
    """Target scheme per module role. ``passthrough`` keeps the checkpoint's own format.

    ``rules`` come first and the first matching rule wins (llm-compressor targets/ignore,
    ``re:`` regexes and globs); then ``mtp`` (unless ``inherit``) for the MTP block; then the
    per-role fields.
    """

    routed_experts: str = "nvfp4"
    shared_experts: str = "passthrough"
    gate: str = "passthrough"
    attn: AttnPrecision = field(default_factory=AttnPrecision)
    compressor: str = "passthrough"
    indexer: IndexerPrecision = field(default_factory=IndexerPrecision)
    embed: str = "passthrough"
    head: str = "passthrough"
    mtp: str = "passthrough"          # passthrough = MTP untouched; inherit = follow the roles
    fp8_scale_fmt: str = "ue8m0"      # fp8_block scales: ue8m0 (DeepGEMM) or fp32
    rules: list[PrecisionRule] = field(default_factory=list)

    def __post_init__(self) -> None:
        for key, value in self.role_schemes().items():
            _check_choice(f"precision.{key}", value, _SCHEMES)
        _check_choice("precision.mtp", self.mtp, [*_SCHEMES, "inherit"])
        _check_choice("precision.fp8_scale_fmt", self.fp8_scale_fmt, ("ue8m0", "fp32"))

    def role_schemes(self) -> dict[str, str]:
        """Flat role -> scheme map ('attn.wo_a' -> 'fp8_block', ...)."""
        flat = {k: getattr(self, k) for k in
                ("routed_experts", "shared_experts", "gate", "compressor", "embed", "head")}
        flat.update({f"attn.{k}": v for k, v in vars(self.attn).items()})
        flat.update({f"indexer.{k}": v for k, v in vars(self.indexer).items()})
        return flat


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
