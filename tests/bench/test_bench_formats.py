"""The formats benchmark runs end to end on a tiny shape and reports every op."""
from types import SimpleNamespace

from nvfp4stack.bench import formats


def test_bench_reports_each_op():
    res = formats.run(SimpleNamespace(bench=SimpleNamespace(rows=256, cols=512, repeats=1, threads=1, device="cpu")))
    ops = [r["op"] for r in res]
    assert len(ops) == 9 and any("mxfp4_to_nvfp4" in o for o in ops)
    assert all(r["MB_per_s"] > 0 and r["input_bytes"] > 0 for r in res)
