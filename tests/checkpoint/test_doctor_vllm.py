"""The doctor with vLLM's load check on a weight-only NVFP4 checkpoint (no input_scale, as a data-free
convert writes it): the plan serves the experts nvfp4_w4a16, so both mappers load it and the unset
input_scale parameters are a note, not an error."""
from __future__ import annotations

import pytest

from nvfp4stack.doctor import diagnose
from nvfp4stack.models.deepseek_v4.doctor import weight_only_input_scales
from nvfp4stack.models.deepseek_v4.load_check import vllm_importable
from tests.checkpoint.test_doctor import _served, layouts, no_input_scales  # noqa: F401  (fixtures)


def test_weight_only_regex_names_the_layers_served_weight_only():
    served = {"layers.0.ffn.experts.0.w1": "nvfp4_w4a16", "layers.0.ffn.experts.1.w2": "nvfp4_w4a16",
              "layers.2.ffn.experts.0.w1": "nvfp4_w4a16", "layers.2.ffn.experts.1.w1": "nvfp4",
              "layers.0.attn.wq_a": "bf16", "mtp.0.ffn.experts.0.w1": "nvfp4_w4a16"}
    assert weight_only_input_scales(served) == r"^model\.layers\.(0)\.ffn\.experts\..*input_scale$"
    assert weight_only_input_scales({"layers.1.ffn.experts.0.w1": "nvfp4"}) is None


@pytest.mark.slow
@pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")
def test_vllm_loads_weight_only_experts_without_input_scale(layouts, no_input_scales):  # noqa: F811
    r = diagnose(no_input_scales, vllm="on", plan=_served(layouts, "nvfp4_w4a16"))
    print(r.table())
    assert r.errors == [] and r.exit_code == 0
    assert r.stats["vllm_cuda"] == "ok" and r.stats["vllm_cpu"] == "ok" and not r.skipped
    assert any("left unset as planned" in n and "w13_input_scale" in n for n in r.notes), r.notes
    assert r.table().splitlines()[-1].startswith("result: clean")
