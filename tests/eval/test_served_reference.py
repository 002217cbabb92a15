"""eval/served_reference.py: the fp32 reference of a served checkpoint carries exactly the weights
that checkpoint stores, and openai_check's logprob comparison runs on it (tiny DeepSeek-V4, CPU).

The served checkpoint is the README's weight-only cast (`quantize.method=cast`, NVFP4 W4A16 experts
from the release's MXFP4, FP8-block attention as released): what `gpu_host.sh serve-check
tiny_dsv4_h200` serves on a GPU.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.eval import served_reference as sr
from nvfp4stack.models.deepseek_v4.layouts import hf_to_native
from nvfp4stack.quantize.report import dequantize_group
from nvfp4stack.schemes import Scheme


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(bf16 dir, cast checkpoint dir) of the tiny DeepSeek-V4."""
    from nvfp4stack.cli import compose_config
    from nvfp4stack.families.registry import factories
    from nvfp4stack.families.resolve import cache_root
    from nvfp4stack.tasks import quantize as task

    pytest.importorskip("transformers.models.deepseek_v4")
    run = tmp_path_factory.mktemp("cast")
    cfg = compose_config("recipe=tiny_dsv4", "quantize.method=cast", "command=quantize",
                         "precision.routed_experts=nvfp4_w4a16", f"run_dir={run}")
    assert task.run(cfg) == 0
    return factories()["tiny_dsv4"](cache_root(cfg.cache_dir), "bf16"), run / "quantized"


def _weight(model, native: str) -> torch.Tensor:
    for hf_name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and hf_to_native(hf_name + ".weight") == native + ".weight":
            return mod.weight
    raise KeyError(native)


def test_stored_schemes_of_the_cast(served):
    schemes = sr.stored_schemes(served[1])
    assert schemes["layers.0.ffn.experts.3.w1"] is Scheme.NVFP4
    assert schemes["layers.1.attn.wo_a"] is Scheme.FP8_BLOCK
    assert schemes["layers.1.attn.compressor.wkv"] is Scheme.BF16


def test_reference_carries_the_served_weights(served):
    from nvfp4stack.models.deepseek_v4.reference import load_reference

    bf16_dir, cast = served
    from nvfp4stack.models.deepseek_v4.reference import served_reference

    ref = served_reference(bf16_dir, cast)
    plain = load_reference(bf16_dir)
    reader = ShardedReader(cast)
    wo_a = dequantize_group(reader, "layers.1.attn.wo_a.weight")
    assert torch.equal(_weight(ref, "layers.1.attn.wo_a"), wo_a)
    assert not torch.equal(_weight(plain, "layers.1.attn.wo_a"), wo_a)  # the swap did something
    experts = ref.model.layers[2].mlp.experts
    w1 = dequantize_group(reader, "layers.2.ffn.experts.5.w1.weight")
    w2 = dequantize_group(reader, "layers.2.ffn.experts.5.w2.weight")
    assert torch.equal(experts.gate_up_proj[5][: w1.shape[0]], w1) and torch.equal(experts.down_proj[5], w2)
    ids = torch.tensor([[3, 17, 42, 99, 7, 250]])
    with torch.no_grad():
        a, b = ref(ids).logits, plain(ids).logits
    assert torch.isfinite(a).all() and 0 < (a - b).abs().max() < 5  # FP8 attention: close, not equal


class _FakeClient:
    """An OpenAI-client stand-in whose prompt_logprobs come from a model (plus an offset on one token)."""

    def __init__(self, model, offset: float = 0.0, flat_below: int = 0):
        self.model, self.offset, self.flat_below = model, offset, flat_below
        self.completions = SimpleNamespace(create=self._create)

    def _create(self, model, prompt, max_tokens, temperature, extra_body):
        assert extra_body == {"prompt_logprobs": 0} and max_tokens == 1 and temperature == 0
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt])).logits[0].float()
        if len(prompt) < self.flat_below:  # a server whose logits are all equal on short prompts
            logits = torch.zeros_like(logits)
        lp = torch.log_softmax(logits, -1)
        entries = [None] + [{str(t): {"logprob": lp[i, t].item() + (self.offset if i == 0 else 0.0)}}
                            for i, t in enumerate(prompt[1:])]
        return SimpleNamespace(choices=[SimpleNamespace(prompt_logprobs=entries)])


def test_logprob_deltas_use_the_served_reference(served):
    from nvfp4stack.engine.openai_check import LONG_PROMPT_TOKENS, PREFIX_LENGTHS, PROMPTS, logprob_deltas
    from nvfp4stack.models.deepseek_v4.reference import load_reference

    bf16_dir, cast = served
    ref = sr.reference_for(bf16_dir, cast)
    same = logprob_deltas(_FakeClient(ref), "tiny-dsv4", str(bf16_dir), str(cast))
    assert len(same["per_prompt"]) == len(PROMPTS) + 1 and same["max_abs"] < 1e-4
    assert same["per_prompt"][-1]["tokens"] == LONG_PROMPT_TOKENS - 1  # past the 128-token window
    assert [r["length"] for r in same["by_length"]] == list(PREFIX_LENGTHS)
    assert all(r["max_abs"] < 1e-4 and r["flat_positions"] == 0 for r in same["by_length"])
    assert len(same["per_prompt"][0]["served"]) == len(same["per_prompt"][0]["ids"]) - 1
    short = logprob_deltas(_FakeClient(ref, flat_below=100), "tiny-dsv4", str(bf16_dir), str(cast))
    by_len = {r["length"]: r for r in short["by_length"]}
    assert by_len[64]["flat_positions"] == 63 and by_len[64]["max_abs"] > 0.1
    assert by_len[128]["flat_positions"] == 0 and by_len[128]["max_abs"] < 1e-4
    assert all(r["flat_positions"] == r["tokens"] for r in short["per_prompt"][:-1])
    off = logprob_deltas(_FakeClient(ref, offset=0.5), "tiny-dsv4", str(bf16_dir), str(cast))
    assert 0.49 < off["max_abs"] < 0.51
    # a server on other weights (the BF16 ones, not the served FP8/NVFP4 bytes) shows up
    plain = logprob_deltas(_FakeClient(load_reference(bf16_dir)), "tiny-dsv4", str(bf16_dir), str(cast))
    assert plain["max_abs"] > 1e-3


def test_deepseek_v3_family_uses_the_tiny_v3_reference(monkeypatch, tmp_path):
    """The tiny DeepseekV3 model (serve-check tiny_v3_h200) keeps its own reference: W4A16 experts."""
    import nvfp4stack.models.deepseek_v3.tiny as tv3

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3"}))
    seen = {}
    monkeypatch.setattr(tv3, "reference_model", lambda b, n, *, w4a4: seen.update(args=(b, n, w4a4)) or "ref")
    assert sr.reference_for(tmp_path, tmp_path / "nvfp4") == "ref"
    assert seen["args"] == (tmp_path, tmp_path / "nvfp4", False)


def test_unknown_family_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    with pytest.raises(ValueError, match="model_type 'mixtral' belong to no registered model family"):
        sr.reference_for(tmp_path, tmp_path)
