"""Training budget and optimizer settings (conf/train/default.yaml composes to these defaults)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nvfp4stack.families.registry import train_budget, train_budgets

DTYPES = ("float32", "bfloat16")


@dataclass
class TrainConfig:
    """AdamW with linear warmup then cosine decay to ``lr * min_lr_ratio``, on corpus windows."""

    steps: int | None = None          # null: the model's default budget (its family's train_budgets)
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    heldout_fraction: float = 0.05    # of the corpus's texts, by text, never seen in training
    chat_fraction: float = 0.2        # training texts wrapped in the chat template (user asks, assistant goes on)
    eval_tokens: int = 16384          # held-out tokens scored at the start and the end
    dtype: str = "float32"            # bfloat16: autocast on CPU (weights and AdamW stay fp32)
    seed: int = 0

    def __post_init__(self) -> None:
        positive = {"batch_size": self.batch_size, "seq_len": self.seq_len, "eval_tokens": self.eval_tokens,
                    "lr": self.lr}
        if self.steps is not None:
            positive["steps"] = self.steps
        for key, value in positive.items():
            if value <= 0:
                raise ValueError(f"train.{key}={value}: expected > 0; set a positive value")
        for key in ("min_lr_ratio", "chat_fraction"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"train.{key}={getattr(self, key)}: expected within [0, 1]; fix it")
        if not 0.0 < self.heldout_fraction < 0.5:
            raise ValueError(f"train.heldout_fraction={self.heldout_fraction}: expected in (0, 0.5); "
                             "the default 0.05 keeps 5% of the texts for held-out scoring")
        if self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps={self.warmup_steps}: expected >= 0; set 0 for no warmup")
        if self.dtype not in DTYPES:
            raise ValueError(f"train.dtype={self.dtype!r} is not valid; expected one of: {', '.join(DTYPES)}")

    def resolved(self, model: str) -> "TrainConfig":
        """This config with ``steps`` filled in from the model's default budget."""
        if self.steps is not None:
            return self
        steps = train_budget(model)[0]
        if steps is None:
            raise ValueError(f"train.steps is null and model {model!r} has no default budget (known: "
                             f"{', '.join(train_budgets())}); set train.steps=N")
        return dataclasses.replace(self, steps=steps)

    def key(self) -> dict:
        """What the trained weights depend on (the cache key and the manifest's ``train``)."""
        return dataclasses.asdict(self)


def warn_unused_train(cfg) -> None:
    """One stderr line when ``train.*`` differs from the defaults for a command other than ``train``:
    only ``python main.py train`` reads it; serve, eval and the factories use the default-budget cache
    entry (training it with the defaults when absent)."""
    if cfg.command == "train":
        return
    default = TrainConfig()
    changed = [f"train.{k}" for k, v in dataclasses.asdict(cfg.train).items() if v != getattr(default, k)]
    if changed:
        import sys

        print(f"nvfp4stack {cfg.command}: warning: {', '.join(changed)} ignored: only `python main.py train` "
              f"reads train.*; {cfg.command} uses the cached default-budget model", file=sys.stderr, flush=True)
