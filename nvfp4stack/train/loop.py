"""The training loop: AdamW, warmup + cosine, gradient clipping, a progress bar, held-out scoring."""
from __future__ import annotations

import contextlib
import math
import time
from typing import Callable

import torch
from tqdm import tqdm

from nvfp4stack.train.config import TrainConfig
from nvfp4stack.train.data import Streams, heldout_batches, train_batch


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of ``step`` (0-based): linear warmup, then cosine to ``lr * min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _autocast(cfg: TrainConfig):
    if cfg.dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _deterministic(seed: int):
    """Seeded RNG and torch's deterministic algorithms requested for the run (``warn_only``: an op
    with no deterministic implementation warns instead of failing, so this is no guarantee by
    itself); the caller's settings (a test session, the CLI process) are restored afterwards."""
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    rng = torch.get_rng_state()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.set_rng_state(rng)


def _lm_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of ``ids`` [B, T] (transformers shifts the labels)."""
    return model(input_ids=ids, labels=ids, use_cache=False).loss


@torch.no_grad()
def heldout_loss(model, batches: list[torch.Tensor], cfg: TrainConfig) -> float:
    """Mean next-token loss over the held-out windows (token-weighted)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with _autocast(cfg):
        for ids in batches:
            n = ids.numel() - ids.shape[0]  # predicted positions: T-1 per window
            total += _lm_loss(model, ids).float().item() * n
            count += n
    model.train(was_training)
    return total / count


def _decay_groups(model, weight_decay: float) -> list[dict]:
    """Matrices decay; norms, biases and 1-D gains do not (the usual GPT recipe)."""
    decay, keep = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def train_loop(model, streams: Streams, cfg: TrainConfig, desc: str,
               on_step: Callable[[int, float], None] | None = None) -> dict:
    """Train ``model`` in place for ``cfg.steps`` steps; returns the run's numbers for the manifest.

    Repeatable for a given (model init, cfg, torch build, thread count): the batches come from a
    generator seeded with ``cfg.seed`` and torch's deterministic algorithms are requested in
    ``warn_only`` mode (see :func:`_deterministic`; tests/train checks that two runs agree bit for bit).
    """
    if cfg.steps is None:
        raise ValueError("train_loop: cfg.steps is None; call cfg.resolved(model_name) first")
    with _deterministic(cfg.seed):
        return _train(model, streams, cfg, desc, on_step)


def _train(model, streams: Streams, cfg: TrainConfig, desc: str, on_step) -> dict:
    gen = torch.Generator().manual_seed(cfg.seed)
    held = heldout_batches(streams.heldout, cfg)
    initial = heldout_loss(model, held, cfg)
    opt = torch.optim.AdamW(_decay_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=desc, unit="step", dynamic_ncols=True, mininterval=2.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        ids = train_batch(streams.train, cfg, gen)
        with _autocast(cfg):
            loss = _lm_loss(model, ids)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{desc}: training loss is {loss.item()} at step {step}; lower train.lr "
                                     f"(now {cfg.lr}) or use train.dtype=float32")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        tok_s = (step + 1) * ids.numel() / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tok_s:.0f}", refresh=False)
        if on_step is not None:
            on_step(step, losses[-1])
    bar.close()
    wall = time.perf_counter() - t0
    model.eval()
    final_held = heldout_loss(model, held, cfg)
    tail = losses[-min(20, len(losses)):]
    train_final = sum(tail) / len(tail)
    return {
        "steps": cfg.steps, "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "train_texts": streams.train_texts, "heldout_texts": streams.heldout_texts,
        "train_stream_tokens": streams.train.numel(), "heldout_tokens_scored": sum(b.numel() for b in held),
        "first_train_loss": losses[0], "final_train_loss": train_final, "final_train_ppl": math.exp(train_final),
        "initial_heldout_loss": initial, "initial_heldout_ppl": math.exp(initial),
        "final_heldout_loss": final_held, "final_heldout_ppl": math.exp(final_held),
        "wall_s": round(wall, 2), "tokens_per_s": round(cfg.steps * cfg.batch_size * cfg.seq_len / wall, 1),
        "torch_threads": torch.get_num_threads(), "loss_curve": [round(x, 4) for x in losses[:: max(1, cfg.steps // 50)]],
    }
