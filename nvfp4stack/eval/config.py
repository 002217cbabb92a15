"""Fidelity evaluation settings."""
from __future__ import annotations

from dataclasses import dataclass

# auto: the model family's first fidelity level (ModelFamily.eval_levels), resolved by the eval task
EVAL_LEVELS = ("auto", "layertest", "e2e", "serve_task")


@dataclass
class EvalConfig:
    level: str = "auto"
    num_prompts: int = 8
    max_tokens: int = 64
    seed: int = 0
    tasks_file: str | None = None     # JSONL of {prompt, answer} for serve_task
    endpoint: str = "http://127.0.0.1:8000/v1"
    rel_tol: float = 1e-6             # serve_task: numeric answers match within this relative tolerance
    reference_path: str | None = None  # BF16 checkpoint to compare against when model.source_format != bf16

    def __post_init__(self) -> None:
        if self.level not in EVAL_LEVELS:
            raise ValueError(f"eval.level={self.level!r} is not valid; expected one of {', '.join(EVAL_LEVELS)}")
