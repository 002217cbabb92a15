"""Which elements of meta-device parameters a load wrote, without holding any parameter's data.

The load check builds vLLM's model on the meta device and feeds it meta tensors from the
safetensors headers, so no value exists to carry a sentinel. Instead :class:`WriteRecorder` (a
torch dispatch mode) records the destination of every in-place write into a parameter's storage
as a box in the parameter's index space (a view's offset and strides decomposed over the
parameter's contiguous strides), and :class:`Coverage` unions the boxes on a coordinate-compressed
grid: memory grows with the number of writes (tensors x experts), never with the bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

Box = tuple[tuple[int, int], ...]   # per parameter dim: [start, end)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def view_box(param: torch.Tensor, view: torch.Tensor) -> Box | None:
    """The box of ``param`` that ``view`` (a view of its storage) covers; None if not a box
    (a view whose strides are not a subset of the parameter's, e.g. a reshaped or strided slice)."""
    shape, strides = tuple(param.shape), tuple(param.stride())
    if not param.is_contiguous():
        return None
    rel = view.storage_offset() - param.storage_offset()
    if rel < 0 or not shape:
        return () if rel == 0 and not shape else None
    start = []
    for st, n in zip(strides, shape):
        i, rel = divmod(rel, st)
        if i >= n:
            return None
        start.append(i)
    if rel:
        return None
    extent = [1] * len(shape)
    for n, st in zip(view.shape, view.stride()):
        if n == 1:
            continue
        dims = [d for d, (s, m) in enumerate(zip(strides, shape)) if s == st and m > 1 and extent[d] == 1]
        if not dims:
            return None
        extent[dims[0]] = n
    if any(s + e > n for s, e, n in zip(start, extent, shape)):
        return None
    return tuple((s, s + e) for s, e in zip(start, extent))


@dataclass
class Coverage:
    """The union of the boxes written into one parameter."""

    shape: tuple
    boxes: set = field(default_factory=set)
    opaque: list = field(default_factory=list)   # writes that are not boxes (op names): coverage unknown

    def _grid(self):
        """(breakpoints per dim, bool grid of covered cells)."""
        if not self.shape:
            return [], np.array(bool(self.boxes))
        bps = [sorted({0, n, *(b[d][0] for b in self.boxes), *(b[d][1] for b in self.boxes)})
               for d, n in enumerate(self.shape)]
        grid = np.zeros([len(bp) - 1 for bp in bps], dtype=bool)
        for b in self.boxes:
            grid[tuple(slice(bp.index(lo), bp.index(hi)) for bp, (lo, hi) in zip(bps, b))] = True
        return bps, grid

    def unwritten(self) -> tuple[int, list[int]]:
        """(number of elements never written, first-dim indices with any such element)."""
        bps, grid = self._grid()
        if not self.shape:
            return (0 if grid else 1), []
        widths = np.ones(grid.shape, dtype=np.int64)
        for d, bp in enumerate(bps):
            w = np.diff(np.asarray(bp, dtype=np.int64))
            widths = widths * w.reshape([-1 if i == d else 1 for i in range(len(bps))])
        n_bad = int(widths[~grid].sum())
        rows = ~grid.reshape(grid.shape[0], -1).all(-1) if grid.size else np.ones(0, dtype=bool)
        bad_first = [i for c, bad in enumerate(rows) if bad for i in range(bps[0][c], bps[0][c + 1])]
        return n_bad, bad_first


class WriteRecorder(TorchDispatchMode):
    """Records every in-place write into the given parameters' storages (any op whose schema marks
    an argument as written: copy_, fill_, index_put_, ...)."""

    def __init__(self, params: dict[str, torch.Tensor]):
        super().__init__()
        self.params = params
        self.by_storage = {_storage_key(p): n for n, p in params.items()}
        self.coverage = {n: Coverage(tuple(p.shape)) for n, p in params.items()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            t = args[i] if i < len(args) else kwargs.get(a.name)
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                name = self.by_storage.get(_storage_key(t))
                if name is not None:
                    self._record(name, func, args, t)
        return func(*args, **kwargs)

    def _record(self, name: str, func, args, view: torch.Tensor) -> None:
        if view.numel() == 0:  # e.g. the vocab padding fill_ when there is no padding
            return
        cov = self.coverage[name]
        # index_put_ / masked writes touch an unknown subset of the view: coverage unknown
        box = view_box(self.params[name], view) if func.__name__.split(".")[0] in ("copy_", "fill_", "zero_") else None
        if box is None:
            cov.opaque.append(func.__name__)
        else:
            cov.boxes.add(box)
