"""Client side of the DeepSeek-V4-Flash serve runs (issue #34), against a live vLLM OpenAI server.

Greedy completions of 8 prompts (token ids, 1 to 600 long, drawn from a fixed seed inside the
tokenizer's ids), 16 tokens each with the top logprob; then decode throughput at the given batch
sizes (concurrent requests of --decode-tokens tokens, ignore_eos), --rounds rounds each, median and
range. Standard library only (runs on the GPU host with the bundle's Python).

  python bench/dsv4_flash_run.py --base-url http://127.0.0.1:8011/v1 --model dsv4_flash --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROMPT_LENGTHS = (1, 2, 4, 8, 16, 64, 256, 600)


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def prompts(seed: int = 0, lo: int = 300, hi: int = 2000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(lo, hi) for _ in range(n)] for n in PROMPT_LENGTHS]


def greedy(base: str, model: str, max_tokens: int) -> list[dict]:
    out = []
    for p in prompts():
        r = _post(f"{base}/completions", {"model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0,
                                          "logprobs": 1, "return_token_ids": True})
        c = r["choices"][0]
        lp = c.get("logprobs") or {}
        out.append({"prompt_len": len(p), "text": c["text"], "token_ids": c.get("token_ids"),
                    "tokens": lp.get("tokens"), "logprobs": lp.get("token_logprobs")})
    return out


def decode_tok_s(base: str, model: str, batch: int, tokens: int) -> float:
    body = {"model": model, "prompt": [400 + i for i in range(32)], "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(batch) as ex:
        done = list(ex.map(lambda _: _post(f"{base}/completions", body), range(batch)))
    wall = time.perf_counter() - t0
    return sum(d["usage"]["completion_tokens"] for d in done) / wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--greedy-tokens", type=int, default=16)
    a = ap.parse_args()
    res = {"greedy": greedy(a.base_url, a.model, a.greedy_tokens), "decode": {}}
    decode_tok_s(a.base_url, a.model, 1, 8)   # warm the path once outside the timed rounds
    for b in (int(x) for x in a.batches.split(",")):
        r = [decode_tok_s(a.base_url, a.model, b, a.decode_tokens) for _ in range(a.rounds)]
        res["decode"][b] = {"median": statistics.median(r), "min": min(r), "max": max(r), "rounds": r}
        print(f"decode batch {b}: median {statistics.median(r):.1f} tok/s (min {min(r):.1f}, max {max(r):.1f})",
              flush=True)
    for g in res["greedy"]:
        print(f"greedy len {g['prompt_len']:4d}: {g['token_ids'] or g['tokens']}", flush=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
