"""License-clean calibration / tokenizer text, assembled at run time from stdlib docstrings.

The Python standard library ships with the interpreter under the PSF license, so its docstrings
are text every install already has: no download, no data set to vendor. The order of texts is a
seeded shuffle, so ``calibration_texts(n, seed)`` is deterministic for a given Python version.
"""
from __future__ import annotations

import importlib
import inspect
import random
from functools import lru_cache

# Pure-Python, side-effect-free modules with long, varied English docstrings. Importing
# them is cheap and never touches the network or the terminal.
_MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email",
    "enum", "fractions", "functools", "heapq", "hashlib", "html", "http.client", "inspect",
    "ipaddress", "itertools", "json", "logging", "mailbox", "math", "numbers", "operator",
    "optparse", "pathlib", "pickle", "pprint", "queue", "random", "re", "sched", "secrets",
    "shlex", "shutil", "statistics", "string", "subprocess", "tarfile", "tempfile",
    "textwrap", "threading", "timeit", "tokenize", "typing", "unittest", "urllib.parse",
    "uuid", "warnings", "weakref", "zipfile",
)
_MIN_CHARS = 80  # shorter docstrings are mostly "Return x." and teach nothing


@lru_cache(maxsize=1)
def _all_docstrings() -> tuple[str, ...]:
    """Every distinct, cleaned docstring of the modules above, in a stable order."""
    seen: set[str] = set()
    out: list[str] = []
    for mod_name in _MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:  # a trimmed Python build may lack one; the rest still suffice
            continue
        objs = [mod] + [v for _, v in sorted(vars(mod).items()) if inspect.isclass(v) or inspect.isfunction(v)]
        for obj in objs:
            methods = [v for _, v in sorted(vars(obj).items())] if inspect.isclass(obj) else []
            for o in [obj] + methods:
                doc = inspect.getdoc(o) if (inspect.isclass(o) or inspect.isfunction(o) or inspect.ismodule(o)) else None
                if not doc or len(doc) < _MIN_CHARS:
                    continue
                doc = doc.strip()
                if doc not in seen:
                    seen.add(doc)
                    out.append(doc)
    return tuple(out)


def calibration_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct docstring texts in a seeded order (cycled if ``n`` exceeds the pool)."""
    if n < 1:
        raise ValueError(f"calibration_texts: n must be >= 1, got {n}; ask for at least one text")
    pool = list(_all_docstrings())
    if not pool:
        raise RuntimeError(
            "calibration_texts: found no docstrings in the standard library (Python run with -OO?); "
            "run without -OO"
        )
    random.Random(seed).shuffle(pool)
    return [pool[i % len(pool)] for i in range(n)]


def corpus_size() -> int:
    """How many distinct texts the pool holds."""
    return len(_all_docstrings())
