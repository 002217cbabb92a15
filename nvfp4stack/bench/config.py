"""Benchmark selection: ``bench=<name>`` runs nvfp4stack.bench.<name>.run(cfg)."""
from __future__ import annotations

from dataclasses import dataclass, field

BENCHES = ("formats", "moe_kernel", "cold_start")


@dataclass
class BenchConfig:
    name: str = "formats"
    tokens_per_expert: list[int] = field(default_factory=lambda: [1, 4, 16, 64, 256, 1024, 4096])
    num_experts: int = 32
    shapes: list[str] = field(default_factory=lambda: ["flash", "pro"])
    device: str = "auto"          # auto = cuda when present, else cpu
    size_mb: int = 64             # data volume per format benchmark
    repeat: int = 5

    def __post_init__(self) -> None:
        if self.name not in BENCHES:
            raise ValueError(f"bench.name={self.name!r} is not a benchmark; valid: {', '.join(BENCHES)}")
