"""Issue #3 acceptance: a 4-shard bf16 checkpoint of >= 2 GB converted to NVFP4 experts + FP8
block attention with peak RSS < 3 GB; killed half-way and resumed, the output is byte-identical
to an uninterrupted run. Every phase runs in its own child process, which reports its own peak
RSS (resource.getrusage). Size: NVFP4STACK_ACCEPT_BYTES (default 2.05e9).
Run alone: python -m pytest tests/convert/test_stream_acceptance.py -q -s"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

RULES = {
    "*.ffn.experts.*.w1": "w13_shared_global_scale",
    "*.ffn.experts.*.w3": "w13_shared_global_scale",
    "*.ffn.experts.*.w2": "bf16_to_nvfp4",
    "*.attn.w*": "bf16_to_fp8_block",
    "*": "passthrough",
}
HIDDEN, INTER, EXPERTS = 2048, 1024, 32

GENERATE = r"""
import json, resource, sys, torch
from nvfp4stack.checkpoint.safetensors_io import save_sharded
dst, layers, seed, shard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
H, I, E = %d, %d, %d
g = torch.Generator().manual_seed(seed)
def tensors():
    for L in range(layers):
        for n in ("wq_a", "wo_a"):
            yield f"layers.{L}.attn.{n}.weight", (torch.randn(H, H, generator=g) * 0.02).bfloat16()
        yield f"layers.{L}.attn_norm.weight", torch.ones(H, dtype=torch.bfloat16)
        for e in range(E):
            for n, shape in (("w1", (I, H)), ("w2", (H, I)), ("w3", (I, H))):
                t = torch.randn(*shape, generator=g) * 0.02
                t[0, e] = 1.5  # per-expert outlier
                yield f"layers.{L}.ffn.experts.{e}.{n}.weight", t.bfloat16()
save_sharded(tensors(), dst, max_shard_bytes=shard)
print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""" % (HIDDEN, INTER, EXPERTS)

CONVERT = r"""
import json, resource, sys, time
from nvfp4stack.convert.stream import convert_checkpoint
rules = dict(x.split("=", 1) for x in sys.argv[3:])
t = time.time()
rep = convert_checkpoint(sys.argv[1], sys.argv[2], rules, max_shard_bytes=64 << 20, progress=False)
print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.time() - t, "shards": rep["shards"]}))
"""


def child(code, *args, env=None):
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True,
                         capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_2gb_bounded_rss_kill_resume_identical(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    target = float(os.environ.get("NVFP4STACK_ACCEPT_BYTES", 2.05e9))
    per_layer = 2 * HIDDEN * HIDDEN * 2 + HIDDEN * 2 + EXPERTS * 3 * HIDDEN * INTER * 2
    layers = max(1, int(-(-target // per_layer)))
    total = layers * per_layer
    print(f"\n[seed] {seed}; {layers} layers, {total / 1e9:.2f} GB bf16")
    src = tmp_path / "src"
    gen = child(GENERATE, src, layers, seed, int(total / 4) + (5 << 20))
    shards = sorted(src.glob("*.safetensors"))
    assert len(shards) == 4 and sum(p.stat().st_size for p in shards) >= min(target, 2e9)
    rules = [f"{k}={v}" for k, v in RULES.items()]

    ref = child(CONVERT, src, tmp_path / "ref", *rules)
    print(f"generate peak RSS {gen['peak_rss_mb']:.0f} MB; uninterrupted convert: "
          f"{ref['seconds']:.1f} s, {total / ref['seconds'] / 1e6:.0f} MB/s, peak RSS {ref['peak_rss_mb']:.0f} MB, "
          f"{ref['shards']} shards")
    assert ref["peak_rss_mb"] < 3 * 1024

    journal = tmp_path / ".out.tmp" / "journal.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", CONVERT, str(src), str(tmp_path / "out"), *rules],
                            stdout=subprocess.DEVNULL)
    half = ref["shards"] // 2
    while proc.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) - 1 >= half:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    assert proc.wait() == -signal.SIGKILL
    resumed = child(CONVERT, src, tmp_path / "out", *rules)
    print(f"resumed after SIGKILL at shard {half}/{ref['shards']}: {resumed['seconds']:.1f} s, "
          f"peak RSS {resumed['peak_rss_mb']:.0f} MB")
    assert resumed["peak_rss_mb"] < 3 * 1024
    a, b = sorted((tmp_path / "ref").iterdir()), sorted((tmp_path / "out").iterdir())
    assert [p.name for p in a] == [p.name for p in b]
    for p, q in zip(a, b):
        assert subprocess.run(["cmp", "-s", p, q]).returncode == 0, f"{p.name} differs"
