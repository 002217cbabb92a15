"""``convert`` config group: where to read, where to write, how to treat unknown tensors."""
from __future__ import annotations

from dataclasses import dataclass, field

DEVICES = ("auto", "cpu", "cuda")


@dataclass
class ConvertConfig:
    """src/dst: checkpoint directories (src empty -> cfg.model.path). rules: 'glob=converter'
    strings on module names (converter or 'passthrough'), first match wins; when empty the
    plan of the config chooses. A list, because Hydra's CLI grammar rejects globs as dict keys:
    convert.rules="['*.experts.*=bf16_to_nvfp4','*=passthrough']"."""

    src: str = ""
    dst: str = ""
    overwrite: bool = False
    unknown_tensors: str = "refuse"   # refuse | keep (copied unchanged)
    max_shard_bytes: int = 4 << 30
    device: str = "auto"
    workers: int = 0                  # shards converted at once; 0: auto, one per 2 cores, 1-8; 1: one at a time
    rules: list = field(default_factory=list)
    hf_quant_config: dict = field(default_factory=dict)

    def __post_init__(self):
        from nvfp4stack.convert.validate import UNKNOWN_POLICIES

        if self.unknown_tensors not in UNKNOWN_POLICIES:
            raise ValueError(f"convert.unknown_tensors: expected one of {', '.join(UNKNOWN_POLICIES)}, found "
                             f"{self.unknown_tensors!r}; set convert.unknown_tensors=refuse (the default) or keep")
        if self.device not in DEVICES:
            raise ValueError(f"convert.device: expected one of {DEVICES}, found {self.device!r}; "
                             "set convert.device=auto")
        if int(self.max_shard_bytes) <= 0:
            raise ValueError(f"convert.max_shard_bytes: expected > 0, found {self.max_shard_bytes}; "
                             "use e.g. convert.max_shard_bytes=4294967296")
        if int(self.workers) < 0:
            raise ValueError(f"convert.workers: expected >= 0 (0: auto, one shard in flight per 2 cores, "
                             f"at most 8; 1: one shard at a time), found {self.workers}; set convert.workers=0")
        from nvfp4stack.convert import CONVERTERS  # local: config import must stay light
        from nvfp4stack.convert.units import parse_rules

        bad = {k: v for k, v in parse_rules(self.rules, "convert.rules").items()
               if v != "passthrough" and v not in CONVERTERS}
        if bad:
            raise ValueError(f"convert.rules: unknown converter(s) {bad}; valid: passthrough, "
                             f"{', '.join(CONVERTERS.names())}")
