"""quantize task end to end on the tiny DSV4: modelopt (calibrate + export), crash + export_only,
validate_only, data-free cast, generic unified export. One calibration for the whole module."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.config import ModelConfig, RootConfig
from nvfp4stack.models.deepseek_v4.tiny import layout_dir
from nvfp4stack.quantize.config import QuantizeConfig
from nvfp4stack.tasks import quantize as task
from tests.support import modelopt_dsv4_spec as spec

pytestmark = pytest.mark.slow  # one modelopt calibration (~40 s on 2 cores) shared by the module

CALIB = dict(calib_samples=8, calib_seq_len=64, calib_batch_size=4)


def make_cfg(root, run_dir, **q):
    return RootConfig(
        command="quantize",
        model=ModelConfig(name="tiny_dsv4", family="deepseek_v4", factory="tiny_dsv4"),
        quantize=QuantizeConfig(source=str(layout_dir(root, "bf16")), base=str(layout_dir(root, "release")),
                                **{**CALIB, **q}),
        run_dir=str(run_dir))


@pytest.fixture(scope="module")
def modelopt_run(root, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run_modelopt")
    assert task.run(make_cfg(root, run_dir)) == 0
    return run_dir


def _header(r):
    return {n: (i.dtype, i.shape) for n, i in r.infos.items()}


def test_modelopt_output_is_in_modelopt_dsv4_layout(root, modelopt_run):
    out = modelopt_run / "quantized"
    src = ShardedReader(layout_dir(root, "release"))
    assert _header(ShardedReader(out)) == spec.expected_tensors(_header(src), quantize_mtp=False)
    assert spec.check_hf_quant_config(json.loads((out / "hf_quant_config.json").read_text()), src.names(),
                                      quantize_mtp=False) == []
    assert spec.check_config(json.loads((out / "config.json").read_text()),
                             json.loads((layout_dir(root, "release") / "config.json").read_text())) == []
    assert (out / "tokenizer.json").exists()


def test_modelopt_report_and_weight_error(modelopt_run):
    rep = json.loads((modelopt_run / "quantize_report.json").read_text())
    rel = rep["weight_error_vs_bf16"]["routed_experts"]["rel_error"]
    print(f"modelopt routed-expert weight rel error vs BF16: {rel:.4f}; MXFP4 release: "
          f"{rep['before_error_vs_bf16']['routed_experts']['rel_error']:.4f}; bytes "
          f"{rep['bytes_before']} -> {rep['bytes_after']}")
    assert 0.05 < rel < 0.1
    assert rep["bytes_after"] > rep["bytes_before"]  # NVFP4 adds 8 bits / 16 vs MXFP4's 8 / 32
    assert rep["calibration"]["n_weight_amax"] > 0 and rep["calibration"]["tokens"] > 0
    assert (modelopt_run / "quantize_report.md").exists()
    # the input scales are calibrated, not placeholders
    out = ShardedReader(modelopt_run / "quantized")
    scales = {float(out.get(f"layers.1.ffn.experts.{e}.w2.input_scale")) for e in range(16)}
    assert all(0 < s < 1 for s in scales)


def test_export_only_after_a_crash_is_byte_identical(root, modelopt_run, monkeypatch):
    from nvfp4stack.checkpoint import safetensors_io

    out2 = modelopt_run / "reexport"
    cfg = make_cfg(root, modelopt_run, export_only=True, output_dir=str(out2))
    real_close, calls = safetensors_io.ShardWriter.close, []

    def crash(self):
        calls.append(self.path)
        raise RuntimeError("simulated crash while writing a shard")

    monkeypatch.setattr(safetensors_io.ShardWriter, "close", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        task.run(cfg)
    assert calls and not out2.exists()
    assert not [p for p in modelopt_run.iterdir() if p.name.startswith(".reexport")]  # temp dir cleaned
    monkeypatch.setattr(safetensors_io.ShardWriter, "close", real_close)
    assert task.run(cfg) == 0
    first = sorted(p.name for p in (modelopt_run / "quantized").iterdir())
    assert first == sorted(p.name for p in out2.iterdir())
    for name in first:
        assert (out2 / name).read_bytes() == (modelopt_run / "quantized" / name).read_bytes(), name


def test_validate_only(root, modelopt_run, tmp_path):
    assert task.run(make_cfg(root, modelopt_run, validate_only=True)) == 0
    bad = tmp_path / "bad_state"
    shutil.copytree(modelopt_run / "calib_state", bad)
    from safetensors.torch import load_file, save_file

    amax = load_file(str(bad / "amax.safetensors"))
    amax["layers.2.ffn.experts.0.w2_input_quantizer._amax"] = torch.tensor(float("inf"))
    save_file(amax, str(bad / "amax.safetensors"))
    assert task.run(make_cfg(root, tmp_path, validate_only=True, state_dir=str(bad))) == 1


def test_cast_is_data_free_and_exact_to_the_release(root, modelopt_run, tmp_path):
    from nvfp4stack.quantize.report import dequantize_group

    cfg = make_cfg(root, tmp_path, method="cast", amax_path=str(modelopt_run / "calib_state"))
    assert task.run(cfg) == 0
    out, rel = ShardedReader(tmp_path / "quantized"), ShardedReader(layout_dir(root, "release"))
    assert _header(out) == spec.expected_tensors(_header(rel), quantize_mtp=False)
    for n in ("layers.0.ffn.experts.4.w1.weight", "layers.3.ffn.experts.11.w2.weight"):
        assert torch.equal(dequantize_group(out, n), dequantize_group(rel, n)), n
    assert b"".join(out.iter_raw("mtp.0.ffn.experts.0.w1.weight")) == b"".join(rel.iter_raw("mtp.0.ffn.experts.0.w1.weight"))
    rep = json.loads((tmp_path / "quantize_report.json").read_text())
    cast_rel = rep["weight_error_vs_bf16"]["routed_experts"]["rel_error"]
    mx_rel = rep["before_error_vs_bf16"]["routed_experts"]["rel_error"]
    print(f"cast routed-expert rel error vs BF16 {cast_rel:.4f} (the MXFP4 release's: {mx_rel:.4f}; the cast "
          f"adds no error); stats {rep['export_stats']}")
    # V4's BF16 experts are the release's MXFP4 values (FP4 QAT), and the cast is lossless on them.
    assert cast_rel == 0.0 and mx_rel == 0.0 and rep["export_stats"]["inexact_blocks"] == 0
    assert rep["input_amax_from"] == "amax_path"
    mo = ShardedReader(modelopt_run / "quantized")
    assert torch.equal(out.get("layers.1.ffn.experts.2.w2.input_scale"), mo.get("layers.1.ffn.experts.2.w2.input_scale"))


def test_cast_without_activation_amax_source_fails_naming_the_commands(root, tmp_path):
    cfg = make_cfg(root, tmp_path, method="cast")
    cfg.quantize.source = ""   # release only: nothing to calibrate activations on
    fix = r"quantize.amax_path.*python main.py recipe=.* quantize.*cast_input_amax"
    with pytest.raises(ValueError, match=fix) as e:
        task.run(cfg)
    msg = str(e.value)
    assert "\n" not in msg  # the CLI prints it as one line
    assert "served nvfp4 on torch_emulation" in msg and "quantize.source=<BF16" in msg
    assert "precision.routed_experts=nvfp4_w4a16" in msg
    assert not (tmp_path / "quantized").exists() and not (tmp_path / "calib_state").exists()


def _readme_cast(tmp_path, *overrides):
    """`python main.py recipe=tiny_dsv4 quantize quantize.method=cast` as the CLI composes it (plus
    the small calibration budget the README-commands test adds)."""
    from nvfp4stack.cli import compose_config

    return compose_config("recipe=tiny_dsv4", "quantize.method=cast", "command=quantize",
                          *(f"quantize.{k}={v}" for k, v in CALIB.items()), f"run_dir={tmp_path}", *overrides)


def _check_cast_checkpoint(out, release):
    """Layout, configs and lossless expert weights of a cast checkpoint; returns its input scales."""
    from nvfp4stack.quantize.report import dequantize_group

    r_out, r_rel = ShardedReader(out), ShardedReader(release)
    assert _header(r_out) == spec.expected_tensors(_header(r_rel), quantize_mtp=False)
    assert spec.check_hf_quant_config(json.loads((out / "hf_quant_config.json").read_text()), r_rel.names(),
                                      quantize_mtp=False) == []
    assert spec.check_config(json.loads((out / "config.json").read_text()),
                             json.loads((release / "config.json").read_text())) == []
    for n in ("layers.0.ffn.experts.7.w3.weight", "layers.2.ffn.experts.13.w2.weight"):
        assert torch.equal(dequantize_group(r_out, n), dequantize_group(r_rel, n)), n
    scales = {n: float(r_out.get(n)) for n in r_out.names() if n.endswith(".input_scale")}
    assert scales and all(0 < v < float("inf") for v in scales.values())
    for n in (n for n in r_out.names() if n.endswith(".w1.input_scale")):  # one fused w13 scale
        assert scales[n] == scales[n.replace(".w1.", ".w3.")], n
    return scales


def test_readme_cast_command_composed(tmp_path):
    """The README's cast command, composed like the CLI does, through the task function: the W4A4
    target (torch_emulation on cpu) gets calibrated activation scales and a sane checkpoint."""
    from nvfp4stack.families.registry import factories
    from nvfp4stack.families.resolve import cache_root

    cfg = _readme_cast(tmp_path)
    assert cfg.quantize.method == "cast" and not cfg.quantize.amax_path and cfg.quantize.cast_input_amax is None
    assert task.run(cfg) == 0
    rep = json.loads((tmp_path / "quantize_report.json").read_text())
    assert rep["activations"] == "w4a4" and rep["input_amax_from"] == "calibrated_activations"
    assert rep["weight_error_vs_bf16"]["routed_experts"]["rel_error"] == 0.0
    release = factories()["tiny_dsv4"](cache_root(cfg.cache_dir), "official")
    scales = _check_cast_checkpoint(tmp_path / "quantized", release)
    assert 1.0 not in scales.values() and len(set(scales.values())) > 1  # calibrated, not placeholders
    assert (tmp_path / "calib_state" / "amax.safetensors").exists()


def test_w4a16_cast_needs_no_activation_amax(tmp_path):
    """A weight-only target never reads input_scale: the cast runs data-free (no calibration), writes
    the complete layout vLLM and the doctor expect, with the unit placeholder, and says so."""
    from nvfp4stack.families.registry import factories
    from nvfp4stack.families.resolve import cache_root

    cfg = _readme_cast(tmp_path, "precision.routed_experts=nvfp4_w4a16")
    assert task.run(cfg) == 0
    rep = json.loads((tmp_path / "quantize_report.json").read_text())
    assert rep["activations"] == "w4a16_only" and rep["input_amax_from"] == "w4a16_placeholder"
    assert not (tmp_path / "calib_state").exists()  # nothing was calibrated
    release = factories()["tiny_dsv4"](cache_root(cfg.cache_dir), "official")
    scales = _check_cast_checkpoint(tmp_path / "quantized", release)
    assert set(scales.values()) == {1.0}


def test_readme_cast_calibrates_activations_only(root, modelopt_run, tmp_path):
    """`python main.py recipe=tiny_dsv4 quantize quantize.method=cast` (no amax given): the weights
    are the data-free cast, the input scales come from an activation calibration on the BF16 source,
    equal to the modelopt run's (same calibration settings and seed)."""
    assert task.run(make_cfg(root, tmp_path, method="cast")) == 0
    rep = json.loads((tmp_path / "quantize_report.json").read_text())
    assert rep["input_amax_from"] == "calibrated_activations"
    assert (tmp_path / "calib_state").is_dir()
    out, mo = ShardedReader(tmp_path / "quantized"), ShardedReader(modelopt_run / "quantized")
    for n in ("layers.1.ffn.experts.2.w2.input_scale", "layers.0.ffn.experts.5.w1.input_scale"):
        assert torch.equal(out.get(n), mo.get(n)), n
    assert rep["weight_error_vs_bf16"]["routed_experts"]["rel_error"] == 0.0


def test_cast_with_constant_amax(root, tmp_path):
    assert task.run(make_cfg(root, tmp_path, method="cast", cast_input_amax=8.0, mtp="nvfp4")) == 0
    out = ShardedReader(tmp_path / "quantized")
    assert float(out.get("mtp.0.ffn.experts.0.w1.input_scale")) == pytest.approx(8.0 / 2688.0)
    assert out.infos["mtp.0.ffn.experts.0.w1.weight"].dtype == "U8"


@pytest.mark.slow
def test_generic_unified_export_option(root, tmp_path):
    assert task.run(make_cfg(root, tmp_path, export_format="hf_unified")) == 0
    out = tmp_path / "quantized"
    hfq = json.loads((out / "hf_quant_config.json").read_text())
    assert hfq["quantization"]["quant_algo"] == "NVFP4"
    names = ShardedReader(out).infos
    assert names["model.layers.1.ffn.experts.3.w1.weight"].dtype == "U8"
    assert json.loads((out / "config.json").read_text())["topk_method"] == "noaux_tc"


def test_vllm_own_dsv4_loader_fills_every_parameter(root, modelopt_run):
    """vLLM 0.32's DeepSeek-V4 class + load_weights (CUDA weight-name mapper, run on CPU up to the
    end of loading) on layouts (a), (b) and the modelopt-DSV4 export. Runs the host's own CPU path
    (without AMX the load check's stand-in FP8 block kernel; tests/engine/test_dsv4_load_check.py
    runs both paths)."""
    from nvfp4stack.models.deepseek_v4.load_check import (
        STAND_IN_FP8_BLOCK_KERNEL,
        host_has_amx,
        run_load_check,
        vllm_importable,
    )

    if not vllm_importable():
        pytest.skip("vllm is not installed in this environment")
    dirs = [layout_dir(root, "bf16"), layout_dir(root, "release"), modelopt_run / "quantized"]
    reports = run_load_check(dirs, mappers=("cuda",))
    assert len(reports) == 3
    for r in reports:
        assert r.ok, (r.checkpoint, r.errors)
        # the FP8 layouts' block linears got the stand-in without AMX, vLLM's own kernel with it
        fp8 = r.quant_config == "DeepseekV4FP8Config"
        assert bool(r.fp8_block_kernels) == fp8, (r.checkpoint, r.quant_config, r.fp8_block_kernels)
        assert (STAND_IN_FP8_BLOCK_KERNEL in r.fp8_block_kernels) == (fp8 and not host_has_amx()), r.fp8_block_kernels
