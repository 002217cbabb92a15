"""Tiny DeepseekV3 factory, its modelopt NVFP4 export, and the reference forward built from it."""
import json
import random

import pytest
import torch

from nvfp4stack.models.deepseek_v3.tiny import ROUTING_KEYS, TinyV3Spec, build_tiny_v3, reference_model


@pytest.mark.parametrize("field,value,match", [
    ("kv_lora_rank", 256, "kv_lora_rank: expected 512"),
    ("qk_rope_head_dim", 32, "qk_rope_head_dim: expected 64"),
    ("hidden_size", 200, "hidden_size: expected a multiple of 32"),
    ("moe_intermediate_size", 8, "moe_intermediate_size"),
    ("n_routed_experts", 7, "n_routed_experts: expected divisible by n_group"),
])
def test_spec_rejects_what_vllm_cpu_cannot_run(field, value, match):
    with pytest.raises(ValueError, match=match):
        TinyV3Spec(**{field: value})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from nvfp4stack.quantize.modelopt_ptq import quantize_and_export

    root = tmp_path_factory.mktemp("tiny")
    spec = TinyV3Spec(num_hidden_layers=2, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
                      vocab_size=512, seed=random.randrange(2**16))
    print(f"spec seed={spec.seed}")
    bf16 = build_tiny_v3(root / "bf16", spec)
    nvfp4 = quantize_and_export(bf16, root / "nvfp4", num_samples=4, max_len=32, seed=1,
                                keep_config_keys=tuple(ROUTING_KEYS))
    return spec, bf16, nvfp4


@pytest.mark.slow
def test_build_writes_what_vllm_needs(built):
    spec, bf16, _ = built
    cfg = json.loads((bf16 / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (cfg["topk_method"], cfg["scoring_func"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (
        "noaux_tc", "sigmoid", 512, 64)
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["vocab_size"]) == (1, 2, spec.vocab_size)
    assert (bf16 / "tokenizer.json").exists() and (bf16 / "chat_template.jinja").exists()
    assert not [p for p in bf16.parent.iterdir() if p.name.startswith(".")], "temp dir left behind"


@pytest.mark.slow
def test_export_is_modelopt_nvfp4_experts_only_and_bit_exact(built):
    from safetensors.torch import load_file

    from nvfp4stack.formats.nvfp4 import quantize_nvfp4

    spec, bf16, nvfp4 = built
    cfg = json.loads((nvfp4 / "config.json").read_text())
    q = cfg["quantization_config"]
    assert (q["quant_method"], q["quant_algo"]) == ("modelopt", "NVFP4")
    assert cfg["topk_method"] == "noaux_tc", "routing fields must survive the export"
    from nvfp4stack.quantize.modelopt_ptq import AMAX_FILE, load_amax

    assert (nvfp4 / "tokenizer.json").exists() and not list(nvfp4.rglob("*.pt"))
    amax = load_amax(nvfp4 / AMAX_FILE)  # the calibration snapshot, as safetensors
    assert amax and all(v.numel() and torch.isfinite(v).all() for v in amax.values())
    exported = load_file(str(nvfp4 / "model.safetensors"))
    src = load_file(str(bf16 / "model.safetensors"))
    assert exported["model.layers.0.self_attn.o_proj.weight"].dtype == torch.bfloat16  # experts only
    n = 0
    for layer in range(spec.first_k_dense_replace, spec.num_hidden_layers):
        for e in range(spec.n_routed_experts):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            # transformers saves its fused [E, 2I, H] experts per expert, in the HF names
            w = {k: src[f"{p}.{k}.weight"] for k in ("gate_proj", "up_proj", "down_proj")}
            s2 = [exported[f"{p}.{k}.weight_scale_2"] for k in ("gate_proj", "up_proj")]
            assert torch.equal(s2[0], s2[1]), "modelopt shares w1/w3 global scales"
            for k, weight in w.items():
                ours = quantize_nvfp4(weight, exported[f"{p}.{k}.weight_scale_2"])
                assert torch.equal(ours.data, exported[f"{p}.{k}.weight"]), f"{p}.{k}.weight"
                assert torch.equal(ours.scale.view(torch.uint8), exported[f"{p}.{k}.weight_scale"].view(torch.uint8))
                assert float(exported[f"{p}.{k}.input_scale"]) > 0
                n += weight.numel()
    assert n > 0
    print(f"{n} expert weights bit-identical to modelopt's export")


@pytest.mark.slow
def test_reference_model_uses_the_quantized_experts(built):
    from transformers import DeepseekV3ForCausalLM

    _, bf16, nvfp4 = built
    seed = random.randrange(2**31)
    print(f"seed={seed}")
    ids = torch.randint(3, 512, (1, 24), generator=torch.Generator().manual_seed(seed))
    base = DeepseekV3ForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    w16 = reference_model(bf16, nvfp4, w4a4=False)
    w4 = reference_model(bf16, nvfp4, w4a4=True)
    with torch.no_grad():
        lb, l16, l4 = (m(ids).logits for m in (base, w16, w4))
    # NVFP4 experts change the logits a little, and W4A4 more than W4A16 on top of that.
    assert 0 < (l16 - lb).abs().max() < 2.0
    assert (l4 - l16).abs().max() > 0
    cos = torch.nn.functional.cosine_similarity(l4.flatten(), lb.flatten(), dim=0)
    assert cos > 0.95, cos
