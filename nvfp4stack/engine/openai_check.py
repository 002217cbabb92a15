"""Check a live OpenAI-compatible server with the official ``openai`` client, and compare its
teacher-forced prompt logprobs with the transformers reference forward of the same weights.

``python -m nvfp4stack.engine.openai_check --base-url URL --bf16 DIR --nvfp4 DIR [--json OUT]``:
models, completion, chat, streaming (equal to the non-streamed text), 32 concurrent requests, then
per prompt the |delta logprob| of every prompt token between vLLM (``prompt_logprobs``) and
``eval.served_reference.reference_for`` (transformers' forward of the weights the served checkpoint
stores, fp32; W4A16: bf16 activations served, so the tolerance is bf16's).
Used on the GPU host, where no pytest suite runs; prints one JSON object.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import statistics
import time

PROMPTS = ["The function returns", "Return the number of", "This module provides", "If the argument is",
           "The default value of", "Raise an exception when"]
LONG_PROMPT_TOKENS = 600  # within the GPU recipes' max_model_len (1024)


def client_checks(client, model: str) -> dict:
    out: dict = {"models": [m.id for m in client.models.list().data]}
    c = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0)
    out["completion"] = c.choices[0].text
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[1]}],
                                          max_tokens=16, temperature=0)
    out["chat"] = chat.choices[0].message.content
    stream = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True)
    out["stream_equals_completion"] = "".join(ch.choices[0].text for ch in stream if ch.choices) == out["completion"]

    def one(i):
        r = client.completions.create(model=model, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=8, temperature=0)
        return r.choices[0].text

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        texts = list(pool.map(one, range(32)))
    out["concurrent_32"] = {"answered": sum(isinstance(t, str) for t in texts), "seconds": round(time.monotonic() - t0, 2),
                            "deterministic": all(texts[i] == texts[i % len(PROMPTS)] for i in range(32))}
    return out


PREFIX_LENGTHS = (3, 4, 8, 16, 32, 64, 127, 128, 129, 256, LONG_PROMPT_TOKENS)


def _served_prompt_logprobs(client, model: str, ids: list[int]) -> list[float]:
    r = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 0})
    return [entry[str(t)]["logprob"] for entry, t in zip(r.choices[0].prompt_logprobs[1:], ids[1:])]


def _reference_logprobs(ref, ids: list[int]) -> tuple[list[float], int]:
    """Teacher-forced logprob of every token after the first, and the vocabulary size."""
    import torch

    dev = next(ref.parameters()).device
    with torch.no_grad():
        logits = ref(torch.tensor([ids], device=dev)).logits[0].float()
    lp = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:], device=dev)[:, None])[:, 0]
    return lp.tolist(), logits.shape[-1]


def _row(got: list[float], want: list[float], vocab: int) -> dict:
    d = [abs(a - b) for a, b in zip(got, want)]
    # a logprob of exactly -ln(vocab) is a flat distribution: the server's logits were all equal there
    flat = sum(abs(a + math.log(vocab)) < 1e-3 for a in got)
    return {"tokens": len(d), "max_abs": max(d), "mean_abs": statistics.mean(d), "flat_positions": flat}


def logprob_deltas(client, model: str, bf16_dir: str, nvfp4_dir: str) -> dict:
    """Per prompt, and per prefix length of the long prompt, |served - reference| prompt logprobs.

    A causal reference scores a prefix's tokens as the whole prompt does, so one reference forward
    of the long prompt covers every prefix length (``by_length``): a server that is right on long
    prompts and wrong on short ones shows it there.
    """
    import torch
    from transformers import AutoTokenizer

    from nvfp4stack.eval.served_reference import reference_for

    tok = AutoTokenizer.from_pretrained(bf16_dir)
    ref = reference_for(bf16_dir, nvfp4_dir).to("cuda" if torch.cuda.is_available() else "cpu")
    # the short prompts, then one of LONG_PROMPT_TOKENS: past the flagship's 128-token sliding
    # window and sparse-attention top-k, so windowed and compressed attention take part
    long_ids = tok(" ".join(PROMPTS * 64))["input_ids"][:LONG_PROMPT_TOKENS]
    per_prompt = []
    for p, ids in [(p, tok(p)["input_ids"]) for p in PROMPTS] + [(f"<{len(long_ids)} tokens>", long_ids)]:
        want, vocab = _reference_logprobs(ref, ids)
        got = _served_prompt_logprobs(client, model, ids)
        # per-token values too, so a mismatch can be traced to positions offline (--json)
        per_prompt.append({"prompt": p, **_row(got, want, vocab), "ids": ids,
                           "served": [round(x, 4) for x in got], "reference": [round(x, 4) for x in want]})
    long_got, long_want = got, want   # the loop's last prompt is the long one: its full length is scored
    by_length = [{"length": n, **_row(long_got if n == len(long_ids) else
                                      _served_prompt_logprobs(client, model, long_ids[:n]), long_want[:n - 1], vocab)}
                 for n in PREFIX_LENGTHS if 2 <= n <= len(long_ids)]
    all_max = [x["max_abs"] for x in per_prompt]
    return {"per_prompt": per_prompt, "max_abs": max(all_max), "median_of_max": statistics.median(all_max),
            "by_length": by_length}


def throughput(client, model: str, batches: list[int], max_tokens: int = 64) -> list[dict]:
    """Decode throughput at each concurrency: ``batch`` requests of ``max_tokens`` generated tokens
    (ignore_eos) sent at once; one warm-up round first. Output tokens / wall second."""
    rows = []
    for batch in batches:
        def one(i):
            r = client.completions.create(model=model, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens,
                                          temperature=0, extra_body={"ignore_eos": True})
            return r.usage.completion_tokens
        with concurrent.futures.ThreadPoolExecutor(min(batch, 256)) as pool:
            list(pool.map(one, range(batch)))             # warm-up (graphs, JIT)
            t0 = time.monotonic()
            toks = sum(pool.map(one, range(batch)))
            dt = time.monotonic() - t0
        rows.append({"batch": batch, "output_tokens": toks, "seconds": round(dt, 3),
                     "tok_per_s": round(toks / dt, 1), "ms_per_token_per_seq": round(1000 * dt / max_tokens, 2)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--bf16", required=True, help="the BF16 checkpoint the NVFP4 export was made from")
    ap.add_argument("--nvfp4", required=True, help="the served NVFP4 checkpoint")
    ap.add_argument("--json")
    ap.add_argument("--throughput", default="", help="comma list of concurrencies, e.g. 1,8,32,128")
    ap.add_argument("--no-logprobs", action="store_true", help="skip the reference comparison (large models)")
    args = ap.parse_args(argv)
    import openai

    client = openai.OpenAI(base_url=args.base_url, api_key="EMPTY", timeout=300)
    model = client.models.list().data[0].id
    res = {"model": model, **client_checks(client, model)}
    if args.nvfp4 != args.bf16 and not args.no_logprobs:  # a BF16 checkpoint served as is: no NVFP4 reference
        res["logprobs"] = logprob_deltas(client, model, args.bf16, args.nvfp4)
    if args.throughput:
        res["throughput"] = throughput(client, model, [int(b) for b in args.throughput.split(",")])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    # stdout: the summary, without the per-token lists (those are in --json)
    brief = json.loads(json.dumps(res))
    for row in brief.get("logprobs", {}).get("per_prompt", []):
        for key in ("ids", "served", "reference"):
            row.pop(key, None)
    print(json.dumps(brief, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
