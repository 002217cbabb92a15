"""The files that travel with a checkpoint's weights: configs, tokenizer, license, read-me.

Only these are copied into a converted or quantized checkpoint. Anything else a source directory
holds (notes, ``.pt``/``.bin`` pickles, ``.py`` remote code, scripts) stays behind: a checkpoint is
untrusted input, and the served checkpoint should hold nothing that runs or unpickles.
"""
from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

from nvfp4stack.checkpoint.safetensors_io import check_inside

SIDE_FILES = (
    "config.json", "generation_config.json", "hf_quant_config.json",
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model", "*.tiktoken",
    "chat_template.jinja", "chat_template.json",
    "LICENSE*", "LICENCE*", "license*", "NOTICE*", "USE_POLICY*", "README*", "readme*",
)
# Never copied, whatever the name: pickles, executables, remote code (e.g. LICENSE.py).
REFUSED_SUFFIXES = (".py", ".pyc", ".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt", ".npy", ".npz",
                    ".joblib", ".so", ".sh", ".exe", ".safetensors")


def is_side_file(name: str) -> bool:
    """Whether a file named ``name`` travels with the weights (the allow-list, minus REFUSED_SUFFIXES)."""
    return (not name.lower().endswith(REFUSED_SUFFIXES)
            and any(fnmatch.fnmatchcase(name, pattern) for pattern in SIDE_FILES))


def side_files(src: str | Path, names=None) -> tuple[list[Path], list[str]]:
    """(files to copy, names left behind) of checkpoint dir ``src``: regular files on the allow-list
    (``names``, when given, narrows it). An allow-listed file that links outside ``src`` raises
    ValueError (check_inside); call this before writing anything so a refusal leaves nothing behind."""
    src = Path(src)
    take, skipped = [], []
    for p in sorted(src.iterdir()):
        if p.name.endswith(".safetensors") or p.name == "model.safetensors.index.json" or p.is_dir():
            continue
        if not is_side_file(p.name) or (names is not None and p.name not in names):
            skipped.append(p.name)
            continue
        check_inside(src, p, f"side file {p.name}")
        if p.resolve().is_file():
            take.append(p)
        else:
            skipped.append(p.name)  # a fifo, a device, a dangling link: not a file to copy
    return take, skipped


def copy_side_files(files: list[Path], dst: str | Path) -> None:
    """Copy ``files`` (from side_files) into ``dst`` as regular files (a link's content, never the link)."""
    for p in files:
        shutil.copy2(p.resolve(), Path(dst) / p.name)
