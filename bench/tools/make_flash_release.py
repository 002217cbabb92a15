"""Write a DeepSeek-V4 checkpoint in the release layout at any depth, in bounded memory (issue #36).

  python bench/tools/make_flash_release.py OUT_DIR --layers 2 --seed 0
  python bench/tools/make_flash_release.py OUT_DIR --config tiny_config.json --layers 1 --shard-mb 2

Names, dtypes, shapes and order are ``release_stream``'s on ``with_num_layers(<descriptor>, N)``
(MTP block included): FP8 E4M3 + UE8M0 128x128 projections, MXFP4 routed experts, BF16 compressor /
gate / embeddings, F32 mHC and sinks, I64 tid2eid. Values: small tensors are exactly
``release_stream``'s; matrices above ``CHUNKED_NUMEL`` elements (embedding, head, the widest
projections) are drawn by the same recipe a row block at a time, since the one-shot draw of a
129,280 x 4,096 matrix needs ~13 GB; routed experts are drawn as MXFP4 bytes directly (E2M1 codes
bell-shaped over the grid, UE8M0 scales around 2^-6 varying per row and block), not quantized from
a heavy-tailed BF16 matrix, which takes a second per expert at full width. Peak RSS stays near
the largest tensor (1 GB: the embedding), whatever the depth. config.json is the descriptor's,
cut to N layers; no tokenizer (the tiny one does not cover the full vocabulary). Shards of about
``--shard-mb`` with model.safetensors.index.json, written in a temporary sibling then renamed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nvfp4stack.checkpoint.safetensors_io import save_sharded  # noqa: E402
from nvfp4stack.convert.stream import usable_cores  # noqa: E402
from nvfp4stack.families.resolve import descriptor_files, with_num_layers  # noqa: E402
from nvfp4stack.io_atomic import atomic_dir  # noqa: E402
from nvfp4stack.models.deepseek_v4.spec import TensorGroup, dsv4_tensor_groups  # noqa: E402
from nvfp4stack.models.deepseek_v4.tiny import _gen, _heavy_tailed, _matrix, non_matrix_tensor, release_tensors  # noqa: E402

CHUNKED_NUMEL = 1 << 24      # above this a matrix is drawn a row block at a time (~0.4 GB of draws each)
# |E2M1 code| 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6: relative frequencies of a bell over the grid
E2M1_MAGNITUDE_WEIGHTS = (10, 16, 14, 10, 7, 5, 3, 1)
UE8M0_CENTER = 121           # 2^-6: expert weights ~1e-2 over a 6.0 E2M1 range


def _nibble_lut() -> torch.Tensor:
    """512 -> E2M1 nibble: bit 0 of the index the sign, the rest a magnitude by its weight."""
    w = torch.tensor(E2M1_MAGNITUDE_WEIGHTS, dtype=torch.float64)
    cdf = torch.cumsum(w / w.sum(), 0)
    mags = torch.searchsorted(cdf, (torch.arange(256, dtype=torch.float64) + 0.5) / 256).clamp(max=7)
    sign = torch.arange(512) & 1
    return (mags.repeat_interleave(2) | (sign << 3)).to(torch.int32)


_NIBBLES = _nibble_lut()


def mxfp4_expert(name: str, shape: tuple[int, int], seed: int) -> dict[str, torch.Tensor]:
    """{name.weight: I8 packed E2M1 [out, in/2], name.scale: F8_E8M0 [out, in/32]} drawn directly."""
    g = _gen(seed, name)
    out_f, in_f = shape
    r = torch.randint(0, 1 << 18, (out_f, in_f // 2), generator=g, dtype=torch.int32)
    codes = (_NIBBLES[r & 511] | (_NIBBLES[r >> 9] << 4)).to(torch.uint8)   # [out, in/2]
    del r
    row = torch.randint(-2, 3, (out_f, 1), generator=g, dtype=torch.int16)
    block = torch.tensor([-1, 0, 0, 1], dtype=torch.int16)[torch.randint(0, 4, (out_f, in_f // 32), generator=g)]
    scale = (UE8M0_CENTER + row + block).to(torch.uint8)                    # [out, in/32]
    return {name + ".weight": codes.view(torch.int8), name + ".scale": scale.view(torch.float8_e8m0fnu)}


def chunked_matrix(tg: TensorGroup, seed: int) -> torch.Tensor:
    """BF16 [out, in] by ``_matrix``'s recipe (heavy-tailed, ~2% outlier input channels) a row block
    at a time, so the draw's temporaries stay ~0.4 GB whatever the matrix."""
    g = _gen(seed, tg.name)
    out_f, in_f = tg.shape
    gain = {"embed": 1.0 * math.sqrt(in_f), "head": 1.0, "gate": 1.0}.get(tg.role, 2.0)
    w = torch.empty((out_f, in_f), dtype=torch.bfloat16)
    cols, mult = None, None
    if tg.role != "embed":
        n_out = max(1, in_f // 50)
        cols = torch.randperm(in_f, generator=g)[:n_out]
        mult = 4.0 + 6.0 * torch.rand(n_out, generator=g)
    rows = max(1, CHUNKED_NUMEL // (4 * in_f))
    for r0 in range(0, out_f, rows):
        block = _heavy_tailed((min(rows, out_f - r0), in_f), gain / math.sqrt(in_f), g)
        if cols is not None:
            block[:, cols] *= mult
        w[r0:r0 + rows] = block.to(torch.bfloat16)
    return w


def group_tensors(tg: TensorGroup, config: dict, seed: int) -> list[tuple[str, torch.Tensor]]:
    """(release name, tensor) of one tensor group; each draw has a generator of its own (``_gen``)."""
    if not tg.is_matrix:
        return [non_matrix_tensor(tg, config, seed)]
    if tg.role == "routed_experts":
        return list(mxfp4_expert(tg.name, tg.shape, seed).items())
    n = tg.shape[0] * tg.shape[1]
    w = chunked_matrix(tg, seed) if n > CHUNKED_NUMEL else _matrix(tg, seed).to(torch.bfloat16)
    return list(release_tensors(tg.name + ".weight", w, tg.role).items())


def release_checkpoint_stream(config: dict, seed: int, jobs: int = 1) -> Iterator[tuple[str, torch.Tensor]]:
    """(release name, tensor) of every tensor ``release_stream`` yields for ``config``, in its order.
    ``jobs`` > 1 draws that many groups at once on threads (torch releases the GIL), at most ``2 * jobs``
    ahead of the writer; every group's generator is its own, so the bytes do not depend on ``jobs``."""
    groups = dsv4_tensor_groups(config)
    if jobs <= 1:
        for tg in groups:
            yield from group_tensors(tg, config, seed)
        return
    with ThreadPoolExecutor(jobs) as pool:
        ahead: deque = deque()
        it = iter(groups)
        for tg in itertools.islice(it, 2 * jobs):
            ahead.append(pool.submit(group_tensors, tg, config, seed))
        while ahead:
            done = ahead.popleft().result()
            tg = next(it, None)
            if tg is not None:
                ahead.append(pool.submit(group_tensors, tg, config, seed))
            yield from done


def release_config(descriptor: dict, layers: int | None) -> dict:
    """config.json: the descriptor cut to ``layers``, without nvfp4stack's own notes."""
    cfg = with_num_layers(descriptor, layers)
    return {k: v for k, v in cfg.items() if not k.startswith("_nvfp4stack")}


def write_release(out: Path, config: dict, seed: int, shard_bytes: int, jobs: int = 1) -> dict:
    """Write the checkpoint at ``out`` (atomically); returns {'tensors', 'bytes', 'shards'}."""
    with atomic_dir(out) as tmp:
        weight_map = save_sharded(release_checkpoint_stream(config, seed, jobs), tmp, max_shard_bytes=shard_bytes)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"tensors": len(weight_map), "shards": len(set(weight_map.values())),
            "bytes": sum(p.stat().st_size for p in out.glob("*.safetensors"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="checkpoint directory to write (replaced if it exists)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers kept (the MTP block is always kept)")
    ap.add_argument("--seed", type=int, default=0)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--descriptor", default="dsv4_flash", help="shipped descriptor name (models/descriptors)")
    src.add_argument("--config", type=Path, help="a DeepSeek-V4 config.json to use instead of a descriptor")
    ap.add_argument("--shard-mb", type=float, default=1024, help="close a shard once it holds this many MiB")
    ap.add_argument("--jobs", type=int, default=max(1, min(16, usable_cores())),
                    help="tensor groups drawn at once (threads); the bytes are the same for every value")
    a = ap.parse_args(argv)
    if a.config is not None:
        descriptor = json.loads(a.config.read_text())
    else:
        known = descriptor_files()
        if a.descriptor not in known:
            print(f"--descriptor {a.descriptor!r}: not a shipped descriptor; valid: {', '.join(sorted(known))}",
                  file=sys.stderr)
            return 2
        descriptor = json.loads(known[a.descriptor].read_text())
    try:
        config = release_config(descriptor, a.layers)
    except ValueError as e:
        print(f"--layers {a.layers}: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if a.jobs > 1:  # each drawing thread's ops get their share of the cores
        torch.set_num_threads(max(1, torch.get_num_threads() // a.jobs))
    done = write_release(a.out, config, a.seed, int(a.shard_mb * 2**20), a.jobs)
    print(f"wrote {a.out}: {done['tensors']} tensors, {done['bytes']:,} bytes in {done['shards']} shards, "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
