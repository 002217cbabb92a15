"""A file written front to back by a background thread, hashed on the way, bypassing the page cache.

The caller copies bytes into one of two page-aligned staging buffers (``append``), or has a byte
range of an input file read straight into them (``append_file``: a pass-through tensor is never
held in memory, nor copied twice); a full buffer goes to a worker thread that hashes it (sha256)
while a second one writes it with O_DIRECT, and the caller fills the other one: reading and
converting the next tensor overlap with hashing and writing this one, and the kernel neither copies
the output into its page cache nor holds gigabytes of it dirty for the closing fsync. Every bulk
copy releases the GIL (numpy's copy, ``preadv``, sha256, ``pwrite``), so the sinks of several
shards in flight (``parallel``) run on as many cores. Where O_DIRECT is refused (tmpfs, some
network file systems, an unaligned device) the same writes go through the page cache.
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

_BLOCK = 16 << 20  # staging buffer: a multiple of every logical block size O_DIRECT may need
_ALIGN = 4096


class TruncatedInput(OSError):
    """``append_file``'s input file ended before the byte range it was asked for."""


class FileSink:
    """Append bytes to ``path`` (created or truncated); ``close()`` returns the sha256 of all of them."""

    def __init__(self, path: str | Path, prefix: bytes = b""):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._direct_fd = None
        if hasattr(os, "O_DIRECT"):
            try:
                self._direct_fd = os.open(self.path, os.O_WRONLY | os.O_DIRECT)
            except OSError:
                self._direct_fd = None
        self._bufs = [mmap.mmap(-1, _BLOCK) for _ in range(2)]
        self._arrays = [np.frombuffer(b, dtype=np.uint8) for b in self._bufs]  # copies into them drop the GIL
        self._pending: list[Future | None] = [None, None]
        self._cur, self._fill, self._offset = 0, 0, 0   # buffer being filled, its fill, its file offset
        self._digest = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="convert-hash")
        self._io = ThreadPoolExecutor(1, thread_name_prefix="convert-write")
        self.append(prefix)

    def append(self, data) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            n = min(len(mv), _BLOCK - self._fill)
            self._arrays[self._cur][self._fill:self._fill + n] = np.frombuffer(mv[:n], dtype=np.uint8)
            self._fill += n
            mv = mv[n:]
            if self._fill == _BLOCK:
                self._hand_off()

    def append_file(self, path: str | Path, offset: int, n: int) -> None:
        """Append bytes ``offset`` .. ``offset + n`` of file ``path``, read straight into the staging
        buffers; TruncatedInput when the file ends before them."""
        fd = os.open(path, os.O_RDONLY)
        try:
            while n:
                k = min(n, _BLOCK - self._fill)
                got = os.preadv(fd, [memoryview(self._bufs[self._cur])[self._fill:self._fill + k]], offset)
                if got == 0:
                    raise TruncatedInput(f"{path} ends {n} bytes early")
                self._fill, offset, n = self._fill + got, offset + got, n - got
                if self._fill == _BLOCK:
                    self._hand_off()
        finally:
            os.close(fd)

    def _hand_off(self) -> None:
        i = self._cur
        self._pending[i] = self._pool.submit(self._flush, i, self._fill, self._offset)
        self._offset += self._fill
        self._cur, self._fill = 1 - i, 0
        self._wait(self._cur)  # the other buffer's bytes are on disk before it is filled again

    def _wait(self, i: int) -> None:
        f, self._pending[i] = self._pending[i], None
        if f is not None:
            f.result()  # re-raises the writer thread's OSError (ENOSPC) here

    def _flush(self, i: int, n: int, offset: int) -> None:
        mv = memoryview(self._bufs[i])[:n]
        written = self._io.submit(self._write, mv, offset)  # the disk works while this thread hashes
        self._digest.update(mv)
        written.result()

    def _write(self, mv: memoryview, offset: int) -> None:
        n = len(mv)
        aligned = n - n % _ALIGN
        if self._direct_fd is not None and aligned:
            try:
                self._pwrite(self._direct_fd, mv[:aligned], offset)
                mv, offset = mv[aligned:], offset + aligned
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                os.close(self._direct_fd)  # the file system or device refuses this alignment
                self._direct_fd = None
        self._pwrite(self._fd, mv, offset)

    @staticmethod
    def _pwrite(fd: int, mv: memoryview, offset: int) -> None:
        while len(mv):
            k = os.pwrite(fd, mv, offset)
            mv, offset = mv[k:], offset + k

    def close(self) -> str:
        """Write what is left, fsync, close; the sha256 hex digest of every byte appended."""
        try:
            if self._fill:
                self._hand_off()
            for i in (0, 1):
                self._wait(i)
            os.fsync(self._fd)
        finally:
            self._release()
        return self._digest.hexdigest()

    def abort(self) -> None:
        try:
            for i in (0, 1):
                f, self._pending[i] = self._pending[i], None
                if f is not None:
                    f.exception()
        finally:
            self._release()

    def _release(self) -> None:
        self._pool.shutdown(wait=True)
        self._io.shutdown(wait=True)
        for fd in (self._fd, self._direct_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._direct_fd = None
        self._arrays = []
        for b in self._bufs:
            try:
                b.close()
            except BufferError:  # a failed write's traceback still views it: freed with the traceback
                pass
