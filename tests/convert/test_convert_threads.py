"""convert's CPU work (issue #36): each unit's torch ops on one thread (the cores go to shards in
flight), the caller's thread count restored, and no torch._dynamo import on the way (torch's meta
kernels pull it in: about a second of every convert)."""
import subprocess
import sys
from pathlib import Path

import torch

from nvfp4stack.convert.base import CONVERTERS
from nvfp4stack.convert.stream import convert_checkpoint, one_torch_thread
from tests.convert.test_stream import RULES, make_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_one_torch_thread_inside_and_the_count_restored_after():
    before = torch.get_num_threads()
    with one_torch_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_every_unit_converts_on_one_thread_sequential_and_parallel(tmp_path, seed, monkeypatch):
    src = tmp_path / "src"
    make_checkpoint(src, seed)
    conv = CONVERTERS.get("bf16_to_nvfp4")
    seen: list[int] = []
    real = conv.convert

    def spy(self, tensors, name):
        seen.append(torch.get_num_threads())
        return real(self, tensors, name)

    monkeypatch.setattr(conv, "convert", spy)
    before = torch.get_num_threads()
    for workers in (1, 3):
        seen.clear()
        convert_checkpoint(src, tmp_path / f"out{workers}", RULES, max_shard_bytes=100_000, progress=False,
                           workers=workers)
        assert seen and set(seen[1:]) == {1}, (workers, seen)  # seen[0]: output specs, before the writing
    assert torch.get_num_threads() == before


def test_a_release_convert_never_imports_torch_dynamo(root, tmp_path):
    from nvfp4stack.models.deepseek_v4.tiny import layout_dir

    src = layout_dir(root, "release")
    code = (
        "import sys\n"
        "from nvfp4stack.cli import compose_config\n"
        "from nvfp4stack.tasks import convert as task\n"
        # model.path: the plan reads the built checkpoint, so no factory builds a tiny in this process
        f"cfg = compose_config('recipe=tiny_dsv4', 'model.source_format=official', 'model.path={src}', "
        f"'precision.routed_experts=nvfp4_w4a16', 'convert.src={src}', 'convert.dst={tmp_path / 'out'}', "
        f"'run_dir={tmp_path / 'run'}')\n"
        "assert task.run(cfg) == 0\n"
        "print('dynamo' if 'torch._dynamo' in sys.modules else 'clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "clean", out.stdout[-2000:]


def test_convert_prints_its_own_rate_once_and_not_when_nothing_is_left(tmp_path, seed, capsys):
    """The README's rate line: input bytes over the time from the first shard to the last; a rerun that
    finds the output complete converts nothing and prints none."""
    import re

    src = tmp_path / "src"
    make_checkpoint(src, seed)
    convert_checkpoint(src, tmp_path / "out", RULES, max_shard_bytes=100_000, progress=False, workers=2)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "of input converted and written in" in ln]
    assert len(lines) == 1
    assert re.fullmatch(r"convert: \d+\.\d\d GB of input converted and written in \d+\.\d s "
                        r"\(\d+\.\d\d GB/s, convert\.workers=2\)", lines[0]), lines[0]
    convert_checkpoint(src, tmp_path / "out", RULES, max_shard_bytes=100_000, progress=False, workers=2)
    assert "of input converted" not in capsys.readouterr().out
