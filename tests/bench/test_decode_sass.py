"""bench/tools/decode_sass.py runs on a CPU host (it compiles for sm90, nothing is launched): a table row per
decode kernel it reads, with positive registers, loop instructions, weight words and instructions per word; or,
where this Triton cannot compile for sm90 (or has no Gluon, or no cuobjdump), exit 2 with a message."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_sass_tool_prints_a_row_per_decode_kernel():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "tools" / "decode_sass.py")], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    if r.returncode == 2 and "decode_sass: needs" in r.stdout and "nothing run" in r.stdout:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    # the columns are 2 spaces apart at least; a cell (pair, tile, loads, opcodes) has single spaces only
    head, *table = [re.split(r"\s{2,}", line.strip()) for line in r.stdout.splitlines()[1:]]
    assert head[:7] == ["pair", "kernel", "tile", "regs", "loop", "words", "/word"], r.stdout
    rows = {(pair, kernel): (int(regs), int(loop), int(words), float(per_word))
            for pair, kernel, _, regs, loop, words, per_word, *_ in table}
    assert len(rows) == len(table), r.stdout
    assert set(rows) == {(p, k) for p in ("one token", "few tokens", "16 tokens") for k in ("L1", "L2")}, r.stdout
    for key, (regs, loop, words, per_word) in rows.items():
        assert regs > 0 and loop > 0 and words > 0 and per_word > 0, (key, r.stdout)
        assert abs(per_word - loop / words) < 0.06, (key, r.stdout)
