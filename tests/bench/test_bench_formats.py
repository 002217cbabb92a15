"""The formats benchmark runs end to end on a tiny shape and reports every op."""
from types import SimpleNamespace

from nvfp4stack.bench import formats


def test_bench_reports_each_op():
    res = formats.run(SimpleNamespace(bench=SimpleNamespace(rows=256, cols=512, repeats=1, threads=1, device="cpu")))
    ops = [r["op"] for r in res]
    assert len(ops) == 9 and any("mxfp4_to_nvfp4" in o for o in ops)
    assert all(r["MB_per_s"] > 0 and r["input_bytes"] > 0 for r in res)


def test_bench_task_prints_a_table(tmp_path, capsys, monkeypatch):
    """`python main.py bench` (bench=formats) prints its rows as a table, not only metrics.json."""
    import json

    from nvfp4stack.tasks import bench as task

    rows = formats.run(SimpleNamespace(bench=SimpleNamespace(rows=128, cols=256, repeats=1, threads=1, device="cpu")))
    monkeypatch.setattr(formats, "run", lambda cfg: rows)
    assert task.run(SimpleNamespace(bench=SimpleNamespace(name="formats"), run_dir=str(tmp_path))) == 0
    out = capsys.readouterr().out.splitlines()
    head = out[0].split()
    assert head[:2] == ["op", "device"] and "MB_per_s" in head
    body = [line for line in out[2:] if line and not line.startswith("benchmark rows")]
    assert len(body) == len(rows) and all(r["op"] in line for r, line in zip(rows, body))
    assert json.loads((tmp_path / "metrics.json").read_text())["rows"] == rows
