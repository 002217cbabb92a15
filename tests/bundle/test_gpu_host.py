"""bundle/gpu_host.sh on CPU: the PYTHONPATH it gives processes sees what the site's .pth files add.

pip --target does not run .pth files; nvidia-cutlass-dsl (vLLM 0.26's DeepSeek-V4 compressor)
puts its `cutlass` package on sys.path through one, and on an H100 the engine failed with
"No module named 'cutlass'" until the path was added.
"""
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "nvfp4stack" / "bundle" / "gpu_host.sh"


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "dslpkg" / "dsl_packages").mkdir(parents=True)
    (site / "dslpkg" / "__init__.py").write_text("")
    (site / "dslpkg" / "dsl_packages" / "fakecutlass.py").write_text("VALUE = 42\n")
    # the shape of nvidia-cutlass-dsl's .pth: an import line that inserts a subfolder
    (site / "dslpkg.pth").write_text(
        "import sys, os, dslpkg; sys.path.insert(0, os.path.join(dslpkg.__path__[0], 'dsl_packages'))\n")
    (site / "plain.pth").write_text("extra_dir\n")
    (site / "extra_dir").mkdir()
    return site


def test_pythonpath_includes_pth_additions(tmp_path):
    site = _site(tmp_path)
    env = {**os.environ, "SITE": str(site), "OUT": str(tmp_path / "out")}
    path = subprocess.run(["bash", str(SCRIPT), "pythonpath"], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()
    parts = path.split(":")
    assert str(site) in parts and str(site / "dslpkg" / "dsl_packages") in parts and str(site / "extra_dir") in parts
    out = subprocess.run([sys.executable, "-c", "import fakecutlass; print(fakecutlass.VALUE)"],
                         env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr
    # without the .pth additions the package is not importable: the check above is not vacuous
    bare = subprocess.run([sys.executable, "-c", "import fakecutlass"], env={**os.environ, "PYTHONPATH": str(site)},
                          capture_output=True, text=True)
    assert bare.returncode != 0 and "No module named 'fakecutlass'" in bare.stderr


def test_unknown_command_prints_usage(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), "nope"], env={**os.environ, "OUT": str(tmp_path)},
                       capture_output=True, text=True)
    assert r.returncode == 2 and "pythonpath" in r.stderr
