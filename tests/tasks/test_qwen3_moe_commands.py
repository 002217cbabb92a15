"""`plan`, `quantize`, `convert`, `doctor` and `eval` on recipe=tiny_qwen3_moe (the second model family),
each as `python main.py ...` in a scratch cache, with assertions on what each writes."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start(tmp_path, *args) -> subprocess.Popen:
    cmd = [sys.executable, "main.py", "recipe=tiny_qwen3_moe", f"cache_dir={tmp_path / 'cache'}", *args]
    logs = tmp_path / f"log{len(list(tmp_path.glob('log*')))}"
    logs.mkdir()
    with open(logs / "out", "w") as out, open(logs / "err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True)
    proc.logs = logs
    return proc


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = (proc.logs / "out").read_text(), (proc.logs / "err").read_text()
    print(" ".join(proc.args), out[-2000:], err[-2000:], sep="\n")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def main(tmp_path, *args) -> subprocess.CompletedProcess:
    return finish(start(tmp_path, *args))


@pytest.mark.slow
def test_commands_on_tiny_qwen3_moe(tmp_path):
    pytest.importorskip("modelopt")
    r = main(tmp_path, f"run_dir={tmp_path / 'plan'}", "plan")
    assert r.returncode == 0 and "plan for tiny_qwen3_moe (qwen3_moe) on cpu" in r.stdout
    rows = json.loads((tmp_path / "plan" / "plan.json").read_text())["rows"]
    experts = [row for row in rows if row["role"] == "routed_experts"]
    assert sum(row["count"] for row in experts) == 4 * 8 * 3 and {row["kernel"] for row in experts} == {"torch_emulation"}
    # gate and up projections are quantized as a pair (one global scale), down projections alone
    assert {row["converter"]: row["count"] for row in experts} == {"w13_shared_global_scale": 64, "bf16_to_nvfp4": 32}
    assert {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj"} <= {row["role"] for row in rows}

    # eval reads the model `plan` built in the scratch cache and writes only its own NVFP4 export there, which
    # nothing below reads: it runs beside them (each is a Python process on one core; CI has two)
    evaluating = start(tmp_path, f"run_dir={tmp_path / 'eval'}", "eval", "eval.num_prompts=2", "eval.max_tokens=16")
    try:
        check_the_checkpoint_commands(tmp_path)
    finally:
        r = finish(evaluating)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert m["level"] == "e2e" and m["precision"] == {"routed_experts": "nvfp4"}
    assert m["e2e"]["prompts"] == 2 and 0 < m["e2e"]["kl_mean"] < 1 and 0 < m["e2e"]["top1_agreement"] <= 1


def check_the_checkpoint_commands(tmp_path):
    """quantize, doctor on its output, convert, doctor on that."""
    r = main(tmp_path, f"run_dir={tmp_path / 'q'}", "quantize", "quantize.calib_samples=4")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "q" / "quantize_report.json").read_text())
    errors = report["weight_error_vs_bf16"]
    assert 0.05 < errors["routed_experts"]["rel_error"] < 0.15 and errors["routed_experts"]["formats"] == ["nvfp4"]
    assert errors["attn.o_proj"]["rel_error"] == 0 and report["bytes_after"] < report["bytes_before"] * 0.6
    quantized = tmp_path / "q" / "quantized"

    r = main(tmp_path, f"run_dir={tmp_path / 'doc'}", f"checkpoint={quantized}", "doctor")
    # no errors; the family has no vLLM load check, which the doctor says instead of "clean"
    assert r.returncode == 0 and "result: no errors, not clean: 1 check(s) skipped (vllm_load)" in r.stdout

    r = main(tmp_path, f"run_dir={tmp_path / 'conv'}", f"convert.dst={tmp_path / 'converted'}", "convert")
    assert r.returncode == 0, r.stderr
    converted = tmp_path / "converted"
    qcfg = json.loads((converted / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_algo"] == "NVFP4" and "model.layers.0.self_attn*" in qcfg["ignore"]
    from safetensors import safe_open

    (shard,) = converted.glob("*.safetensors")
    with safe_open(str(shard), "pt") as f:   # gate and up of one expert share their global scale
        p = "model.layers.2.mlp.experts.3"
        assert f.get_tensor(f"{p}.gate_proj.weight_scale_2") == f.get_tensor(f"{p}.up_proj.weight_scale_2")
    # a data-free convert has no activation scales: the doctor names them and the fix
    r = main(tmp_path, f"run_dir={tmp_path / 'doc2'}", f"checkpoint={converted}", "doctor")
    assert r.returncode == 1 and "input_scale" in r.stdout and "quantize" in r.stdout
