"""Benchmark selection: ``bench=<name>`` runs nvfp4stack.bench.<name>.run(cfg)."""
from __future__ import annotations

from dataclasses import dataclass, field

from nvfp4stack.usage import did_you_mean

BENCHES = ("formats", "moe_kernel", "cold_start", "engine")
SERVERS = ("one_at_a_time", "sequential", "together")   # bench.engine_servers


@dataclass
class BenchConfig:
    name: str = "formats"
    tokens_per_expert: list[int] = field(default_factory=lambda: [1, 4, 16, 64, 256, 1024, 4096])
    num_experts: int = 32
    shapes: list[str] = field(default_factory=lambda: ["flash", "pro"])
    device: str = "auto"          # auto = cuda when present, else cpu
    size_mb: int = 64             # data volume per format benchmark
    repeat: int = 5
    seed: int = 0
    # bench=engine (nvfp4stack/bench/engine.py): settings served one after another, the loads measured
    engine_settings: list[str] = field(default_factory=lambda: ["triton_w4a16", "triton_w4a16+fp8", "marlin",
                                                                "humming", "bf16"])
    engine_rounds: int = 3              # rounds per setting and load, interleaved (median and min-max per cell)
    engine_servers: str = "one_at_a_time"   # one_at_a_time (a start per round) | sequential (one start each, alone,
    # its rounds back to back) | together (one start each, all alive)
    engine_cold_caches: bool = False    # every server start with empty JIT/compile caches (a fresh machine's ready time)
    engine_model: str = "synthetic"     # synthetic (Flash expert shapes, built once) | drawn (the same, weights
    # drawn at load: no disk) | recipe (its checkpoint)
    engine_model_layers: int = 8        # synthetic: 1 dense + 7 MoE layers
    engine_batches: list[int] = field(default_factory=lambda: [1, 8, 32, 128, 256])
    engine_input_len: int = 128         # decode requests' prompt tokens
    engine_output_len: int = 128        # decode requests' generated tokens (ignore_eos)
    engine_decode_waves: int = 4        # decode requests per batch = batch x waves (steadier than one wave)
    engine_prefill_len: int = 2048      # prefill prompts' tokens (one generated token)
    engine_prefill_prompts: int = 32    # 0 = no prefill row
    engine_prefill_concurrency: int = 8
    engine_profile_batch: int = 0       # N > 0: after a setting's last round, one more at batch N under vLLM's torch
    # profiler (traces and their GPU busy/idle summary in the server start's profile/ directory; not in the table)

    def __post_init__(self) -> None:
        if self.name not in BENCHES:
            raise ValueError(f"bench.name={self.name!r} is not a benchmark; valid: {', '.join(BENCHES)}")
        if self.engine_decode_waves < 1:
            raise ValueError(f"bench.engine_decode_waves: expected >= 1 (requests per batch = batch x waves), "
                             f"found {self.engine_decode_waves}; fix: bench.engine_decode_waves=4")
        if self.engine_rounds < 1:
            raise ValueError(f"bench.engine_rounds: expected >= 1 (3 or more to tell a difference from noise), "
                             f"found {self.engine_rounds}; fix: bench.engine_rounds=3")
        if self.engine_profile_batch < 0:
            raise ValueError(f"bench.engine_profile_batch: expected 0 (off) or a batch size > 0, found "
                             f"{self.engine_profile_batch}; fix: bench.engine_profile_batch=128")
        if self.engine_servers not in SERVERS:
            raise ValueError(f"bench.engine_servers: expected one of {', '.join(SERVERS)}, found "
                             f"{self.engine_servers!r}{did_you_mean(self.engine_servers, SERVERS)}; "
                             "fix: bench.engine_servers=one_at_a_time")
