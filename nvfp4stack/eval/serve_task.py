"""Task scoring against a live OpenAI-compatible server: numeric answers, matched as numbers.

A JSONL line is ``{"prompt": "...", "answer": 42}`` (answer a number or a numeric string; optional
``"id"``). The reply's *last* number is the model's answer (chain-of-thought puts the result last),
compared numerically with a relative tolerance: "1,000", "1000.0" and "1e3" all match 1000, and
"10" does not match "100" (a string-matching scorer once cost a team a false 2.3-point gap).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from tqdm import tqdm

# optional sign, digits with optional thousands separators, optional decimals, optional exponent;
# or a fraction a/b. "1,234.5" -> 1234.5
_NUMBER = re.compile(r"(?<![\w.])([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+)(?:\s*/\s*(\d+))?")


def parse_numbers(text: str) -> list[float]:
    """Every number in ``text`` in order (thousands separators, decimals, exponents, a/b fractions)."""
    out = []
    for m in _NUMBER.finditer(text or ""):
        v = float(m.group(1).replace(",", ""))
        if m.group(2):
            d = float(m.group(2))
            v = v / d if d else math.nan
        out.append(v)
    return out


def numbers_match(got: float, want: float, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    return math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol)


def score_reply(reply: str, answer, rel_tol: float = 1e-6) -> tuple[bool, float | None]:
    """(correct, parsed) for one reply: its last number against the expected answer."""
    want = answer if isinstance(answer, (int, float)) else (parse_numbers(str(answer)) or [None])[-1]
    if want is None:
        raise ValueError(f"task answer {answer!r}: expected a number or a string holding one")
    nums = parse_numbers(reply)
    if not nums:
        return False, None
    return numbers_match(nums[-1], float(want), rel_tol), nums[-1]


def load_tasks(path: str | Path) -> list[dict]:
    """The JSONL task set; every line needs 'prompt' and 'answer'."""
    if not path:
        raise ValueError("eval.tasks_file is not set: eval.level=serve_task needs a JSONL of "
                         '{"prompt": ..., "answer": <number>} lines; set eval.tasks_file=<path>')
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"eval.tasks_file={path!r}: no such file; point it at a JSONL task set")
    tasks = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            t = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{n}: not valid JSON ({e}); one JSON object per line") from None
        if not isinstance(t, dict) or "prompt" not in t or "answer" not in t:
            raise ValueError(f"{p}:{n}: expected an object with 'prompt' and 'answer', found {line[:80]!r}")
        tasks.append(t)
    if not tasks:
        raise ValueError(f"{p}: no tasks in the file; add JSONL lines with prompt and answer")
    return tasks


def run_tasks(tasks_file, endpoint: str, model: str, max_tokens: int = 64, rel_tol: float = 1e-6,
              client=None) -> dict:
    """Send every prompt (chat completion, temperature 0) and score the replies by number match."""
    tasks = load_tasks(tasks_file)
    if client is None:
        from openai import OpenAI

        client = OpenAI(base_url=endpoint, api_key="EMPTY", timeout=600)  # vLLM-style servers accept any key
    served = [m.id for m in client.models.list().data]
    if model not in served:
        if len(served) != 1:
            raise ValueError(f"eval.level=serve_task: model {model!r} (model.served_name) is not served at {endpoint}; "
                             f"it serves {served}. Fix: model.served_name=<one of those>")
        print(f"serve_task: {endpoint} serves {served[0]!r}, not {model!r}: using {served[0]!r}")
        model = served[0]
    rows, correct = [], 0
    for i, t in enumerate(tqdm(tasks, desc="serve_task", leave=False)):
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": t["prompt"]}],
                                           max_tokens=max_tokens, temperature=0.0)
        reply = r.choices[0].message.content or ""
        ok, parsed = score_reply(reply, t["answer"], rel_tol)
        correct += ok
        rows.append({"id": t.get("id", i), "answer": t["answer"], "parsed": parsed, "correct": ok, "reply": reply})
    return {"endpoint": endpoint, "model": model, "total": len(tasks), "correct": correct,
            "accuracy": correct / len(tasks), "rel_tol": rel_tol, "items": rows}
