"""Host-side buffers of the Gluon decode kernels (_decode_gluon.py): the per-tile counts of L1's split-K runs
and of the one-token top-k sum in L2, and the split-K workspace. CPU-importable (plain torch)."""
from __future__ import annotations

import torch

_COUNTS: dict = {}
_OUTGROWN: list = []


def split_workspace(cfg, tiles: int, device) -> tuple:
    """(fp32 workspace, int32 counts) for an L1 of split_k > 1 over ``tiles`` (n-tile, block) tiles.

    The workspace is fresh (every run writes before the last reads). The counts persist per device, zero
    between launches (each tile's last run sets its count back); one set serves every stream, as one
    process runs one MoE layer at a time on a device (two split-K calls running at once on two streams
    would share it). They are made, or grown, outside CUDA-graph capture only: a zero fill captured in a
    graph would run at its first replay, after other calls had read the buffer. The forward's first call
    (vLLM's warm-up and profile run, triton_w4a16's warm_up) makes them; an outgrown buffer is kept, as
    graphs captured on it still use it. Where split_k is 1 the kernel reads neither: one placeholder,
    made once per device (no allocation or launch per call)."""
    if cfg.split_k == 1:
        stub_key = ("stub", str(device))
        if stub_key not in _COUNTS:
            _COUNTS[stub_key] = torch.zeros(1, dtype=torch.int32, device=device)
        return _COUNTS[stub_key], _COUNTS[stub_key]
    counts = tile_counters(tiles, device, "the split-K decode tiles", cfg)
    ws = torch.empty(tiles * cfg.split_k * cfg.rows * cfg.block_t, dtype=torch.float32, device=device)
    return ws, counts


def tile_counters(tiles: int, device, what: str, cfg):
    """The device's persistent int32 counts (at least ``tiles``, zero between launches: split_workspace's), for
    ``what`` on tiles ``cfg`` (both named in the error only: no formatting per call). L1's split-K runs and the
    one-token top-k sum of L2 share them: L2 reads them after L1 has ended (after it on the stream, or, launched
    with PDL, after its gdc_wait), when every L1 count is back to zero."""
    key = str(device)
    counts = _COUNTS.get(key)
    if counts is None or counts.numel() < tiles:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"triton_w4a16: {what} ({cfg}) need {tiles} zeroed tile counters on {device}, first asked for inside "
                f"CUDA-graph capture, where their zero fill would not run before the graph is replayed; run the "
                f"MoE forward once at this token count outside capture first (vLLM's warm-up and nvfp4stack's "
                f"hopper_w4a16.warmup.warm_up do)")
        if counts is not None:  # a CUDA graph captured earlier may still launch on it: never freed
            _OUTGROWN.append(counts)
        counts = _COUNTS[key] = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
    return counts
