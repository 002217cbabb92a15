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
_CHILD_TIMEOUT_S = 300  # the child that reads them (see _all_docstrings): ~1 s idle


def _collect_docstrings() -> list[str]:
    """Every distinct, cleaned docstring of the modules above, in a stable order, as this process
    sees them (see :func:`_all_docstrings` for why the pool is read in a fresh interpreter)."""
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
    return out


@lru_cache(maxsize=1)
def _all_docstrings() -> tuple[str, ...]:
    """The docstring pool as a fresh interpreter sees it (``python -I -S``: stdlib only, no site).

    Libraries imported into this process patch stdlib objects (transformers adds
    ``logging.Logger.warning_advice``, others ``typing`` helpers), so an in-process walk would make
    the tokenizer, the calibration texts and the training data, and so the weights, depend on what
    was imported first. Reading the pool in a clean child makes them a function of the Python build
    (``-S`` also keeps site-packages' .pth hooks out of it).
    """
    import json
    import subprocess
    import sys
    from pathlib import Path

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from nvfp4stack.corpus import _collect_docstrings; json.dump(_collect_docstrings(), sys.stdout)")
    root = str(Path(__file__).resolve().parents[1])
    cmd = [sys.executable, "-I", "-S", "-c", code, root]
    what = f"corpus: reading the stdlib docstrings in a fresh interpreter ({sys.executable} -I -S)"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=_CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} took over {_CHILD_TIMEOUT_S} s (it takes ~1 s on an idle machine); "
                           "check that the interpreter starts, or retry on a less loaded machine") from None
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed with exit {p.returncode}: {p.stderr.strip()[-600:]}")
    return tuple(json.loads(p.stdout))


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


_PARAGRAPH_CHARS = 400  # topic paragraphs are merged up to this size: one held-out unit each


@lru_cache(maxsize=1)
def _reference_manual() -> tuple[str, ...]:
    """The Python reference manual's topics (``pydoc_data.topics``, what ``help('assert')`` prints),
    cut into runs of paragraphs so a held-out split can take some of each topic."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a trimmed Python build may lack pydoc_data; the docstrings still suffice
        return ()
    out: list[str] = []
    for name in sorted(topics):
        run = ""
        for para in topics[name].split("\n\n"):
            run = f"{run}\n\n{para}" if run else para
            if len(run) >= _PARAGRAPH_CHARS:
                out.append(run.strip())
                run = ""
        if run.strip():
            out.append(run.strip())
    return tuple(out)


@lru_cache(maxsize=1)
def training_texts() -> tuple[str, ...]:
    """The training corpus of the tiny models: the docstrings above plus the reference manual's topics,
    each distinct text once.

    Both ship with the interpreter (PSF license); nothing is downloaded. ``calibration_texts`` keeps
    to the docstrings, so calibration and eval prompts do not move when this corpus grows.
    """
    return tuple(dict.fromkeys(_all_docstrings() + _reference_manual()))


def normalize_word(word: str) -> str:
    """A whitespace-split word reduced to what "is this a corpus word" should compare: lower case,
    outer punctuation and quotes stripped (``"Return`` and ``return,`` are both ``return``)."""
    return word.strip(".,;:!?()[]{}<>\"'`*-_=|#").lower()


@lru_cache(maxsize=1)
def corpus_words() -> frozenset[str]:
    """Every normalized word of :func:`training_texts` (the vocabulary a trained tiny model speaks)."""
    return frozenset(w for text in training_texts() for w in map(normalize_word, text.split()) if w)
