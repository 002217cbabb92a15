"""Tiny DeepSeek-V4 factory: a structurally faithful, small, seeded random model in three layouts.

(``nvfp4stack.models.deepseek_v4.train.train_tiny_dsv4`` trains it on the stdlib corpus and writes the same
layouts: the ``tiny_dsv4_trained`` factory.)

``build_tiny_dsv4(cache_dir, seed)`` writes, once per (seed, spec version), under ``cache_dir``:

- ``bf16/``    layout (a): BF16 weights with DeepSeek-native names (F32 mHC / attn_sink / ape /
  gate bias, I64 tid2eid), MTP included. transformers' ``DeepseekV4ForCausalLM`` loads it.
- ``release/`` layout (b): the official release format: FP8 E4M3 attention / shared-expert / MTP
  projections with UE8M0 128x128 scales, MXFP4 routed experts (E2M1 + UE8M0 per 32), the rest as in (a).
- ``hf/``      layout (c): what transformers' own ``save_pretrained`` writes after loading (a).
- ``tokenizer/`` the locally trained tokenizer (also copied into each layout).

Shapes keep what vLLM asserts (head_dim 512, qk_rope 64, index_head_dim 128, o_lora_rank % 128 == 0)
and shrink the rest; RoPE is the release's (``rope_theta``, ``compress_rope_theta`` and the YaRN
``rope_scaling`` of ``RELEASE_ROPE_SCALING``). Weights are heavy-tailed (Student-t) with a few
outlier input channels per matrix and an init scale large enough that attention is far from uniform.

Routed experts are FP4-QAT-faithful: DeepSeek-V4 trains its experts quantization-aware in FP4 and
serves the released MXFP4 values as they are, so V4's BF16 expert weights lie on the MXFP4 grid
(E2M1 x UE8M0 per 32). Layout (a) stores exactly those values; the release stores them losslessly.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
import tempfile
import zlib
from pathlib import Path

import torch

from nvfp4stack.models.deepseek_v4.spec import TensorGroup, dsv4_tensor_groups

SPEC_VERSION = 8  # bump when the recipe below changes: it is part of the cache key (4: YaRN rope, 5: window and index top-k 128, 6: 16 indexer heads,
# 7: the tokenizer's docstring corpus read in a fresh interpreter, so a build no longer depends on import order,
# 8: a correctly rounded square root in the heavy-tailed draw, so the bytes no longer depend on MKL's CPU code path)
LAYOUTS = ("bf16", "release", "hf")

# Roles stored as FP8 E4M3 + UE8M0 128x128 in the release (vLLM builds these with the FP8 config;
# compressor and indexer.weights_proj are BF16 there, built with quant_config=None).
RELEASE_FP8_ROLES = frozenset(
    {"attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b", "shared_experts",
     "indexer.wq_b", "mtp.proj"})
RELEASE_MXFP4_ROLES = frozenset({"routed_experts"})

# rope_scaling as the released DeepSeek-V4-Flash config.json ships it (keys and values). vLLM 0.26
# builds V4's rotary cache in fp32, which its fused_inv_rope_fp8_quant asserts, only when rope_type is
# not "default" (its DeepSeek YaRN path). transformers (the reference) and DeepSeek's own inference
# code apply YaRN to the compressed (CSA/HCA) layers only; vLLM 0.26 applies it to the window-only
# layers too (vLLM 0.32 no longer does).
RELEASE_ROPE_SCALING = {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                        "original_max_position_embeddings": 65536, "type": "yarn"}

TINY_DSV4_ARCH = dict(
    hidden_size=256,
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=512,                 # vLLM asserts 512
    qk_rope_head_dim=64,          # vLLM asserts 64
    q_lora_rank=128,
    o_groups=2,
    o_lora_rank=128,              # multiple of 128 (vLLM)
    n_routed_experts=16,
    n_shared_experts=1,
    num_experts_per_tok=6,
    index_n_heads=16,             # DeepGEMM's paged MQA logits (vLLM's V4 indexer) take 16, 32 or 64
    index_head_dim=128,           # vLLM asserts 128
    # FlashMLA's sparse decode (vLLM's V4 attention on sm90/sm100) walks the window and the indexer's
    # picks in blocks of 64 or 128 (it asserts topk % TOPK_BLOCK_SIZE == 0): the release's window, 128
    index_topk=128,
    sliding_window=128,
    compress_ratios=[0, 4, 128, 4],  # window-only, CSA (indexer), HCA, CSA
    num_hash_layers=1,               # layer 0 hash-routed, layers 1-3 noaux_tc
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    num_nextn_predict_layers=1,
    scoring_func="sqrtsoftplus",
    topk_method="noaux_tc",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    swiglu_limit=10.0,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_scaling=RELEASE_ROPE_SCALING,
    # the release's 1048576 = YaRN factor x original length (transformers warns when they disagree)
    max_position_embeddings=16 * 65536,
    hidden_act="silu",
    tie_word_embeddings=False,
)
TOKENIZER_VOCAB = 2048
_RATIO_TO_LAYER_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention",
                        128: "heavily_compressed_attention"}


def tiny_dsv4_config(vocab_size: int, bos_token_id: int, eos_token_id: int, pad_token_id: int) -> dict:
    """config.json of layout (a): legacy fields (vLLM) and their transformers equivalents, both."""
    a = copy.deepcopy(TINY_DSV4_ARCH)  # nested values (rope_scaling, compress_ratios) stay the module's own
    n = a["num_hidden_layers"]
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": vocab_size,
        **a,
        # transformers reads these; vLLM reads compress_ratios / num_hash_layers above. No
        # mlp_layer_types: transformers needs 'hash_moe'/'moe' there while vLLM's config class
        # (transformers' generic validator) accepts only 'sparse'/'dense'; transformers derives it
        # from num_hash_layers when absent.
        "layer_types": [_RATIO_TO_LAYER_TYPE[r] for r in a["compress_ratios"][:n]],
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.1,
    }


def release_config(bf16_config: dict) -> dict:
    """config.json of layout (b): the release's FP8 quantization_config and expert_dtype fp4."""
    cfg = dict(bf16_config)
    cfg["expert_dtype"] = "fp4"
    cfg["quantization_config"] = {
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
        "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
    }
    return cfg


def _gen(seed: int, name: str, device: str | torch.device = "cpu") -> torch.Generator:
    # Seed per tensor name: adding a tensor never shifts the values of the others. A CUDA generator
    # draws other values than the CPU one from the same seed, the same on every GPU.
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))


def _heavy_tailed(shape: tuple, std: float, g: torch.Generator, df: float = 5.0) -> torch.Tensor:
    """Student-t(df) samples scaled to ``std`` (t has variance df/(df-2)), on ``g``'s device."""
    z = torch.randn(shape, generator=g, device=g.device)
    # Chi2 via sum of squares keeps the draw on our seeded generator.
    v = torch.randn((*shape, int(df)), generator=g, device=g.device).pow(2).sum(-1)
    t = z / _sqrt(v / df)
    return t * (std / math.sqrt(df / (df - 2)))


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root on every host. On CPU ``torch.sqrt`` goes through MKL's vector math, whose
    code path, and with it the last bit of about 1 in 150 float32 results, depends on the CPU (an AVX-512 Xeon
    and an AVX2 EPYC drew different tiny checkpoints); numpy's is the IEEE one, as CUDA's ``sqrt`` is."""
    if x.device.type != "cpu":
        return torch.sqrt(x)
    import numpy as np

    return torch.from_numpy(np.sqrt(x.contiguous().numpy()))


def _matrix(tg: TensorGroup, seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """A weight [out, in]: heavy-tailed, plus ~2% outlier input channels scaled 4-10x."""
    g = _gen(seed, tg.name, device)
    out_f, in_f = tg.shape
    gain = {"embed": 1.0 * math.sqrt(in_f), "head": 1.0, "gate": 1.0}.get(tg.role, 2.0)
    w = _heavy_tailed((out_f, in_f), gain / math.sqrt(in_f), g)
    if tg.role not in ("embed",):
        n_out = max(1, in_f // 50)
        cols = torch.randperm(in_f, generator=g, device=g.device)[:n_out]
        w[:, cols] *= 4.0 + 6.0 * torch.rand(n_out, generator=g, device=g.device)
    return w


def _on_mxfp4_grid(w: torch.Tensor, name: str) -> torch.Tensor:
    """``w`` rounded to the MXFP4 grid (what FP4 QAT leaves in V4's experts), as exact BF16."""
    from nvfp4stack.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4

    q = quantize_mxfp4(w.to(torch.bfloat16), name=name)
    return dequantize_mxfp4(q.data, q.scale, torch.bfloat16)


def non_matrix_tensor(tg: TensorGroup, cfg: dict, seed: int, device: str | torch.device = "cpu") -> tuple[str, torch.Tensor]:
    """(native tensor name, value) of a non-matrix group: norms near 1, small biases, mHC, tid2eid."""
    g = _gen(seed, tg.name, device)
    randn = lambda: torch.randn(tg.shape, generator=g, device=g.device)  # noqa: E731
    leaf = tg.name.rsplit(".", 1)[-1]
    if tg.dtype == "i64":  # tid2eid: k distinct experts per token id, every expert reachable
        v, k = tg.shape
        if g.device.type == "cpu":  # the tiny checkpoints' own draw (their bytes are cached and tested)
            idx = torch.stack([torch.randperm(cfg["n_routed_experts"], generator=g)[:k] for _ in range(v)])
        else:  # one draw for all rows: a full vocabulary (129,280 rows) in one launch
            idx = torch.rand((v, cfg["n_routed_experts"]), generator=g, device=g.device).argsort(-1)[:, :k]
        return tg.name, idx.to(torch.int64)
    if tg.role == "norms":
        return tg.name + ".weight", (1.0 + 0.1 * randn()).to(torch.bfloat16)
    if tg.role == "attn_sink":
        return tg.name, randn()
    if leaf == "bias":  # noaux_tc e_score_correction_bias
        return tg.name, 0.05 * randn()
    if leaf == "ape":
        return tg.name, 0.1 * randn()
    if tg.role == "mhc":
        if leaf.endswith("fn"):
            return tg.name, randn() / math.sqrt(tg.shape[-1])
        if leaf.endswith("base"):
            return tg.name, 0.1 * randn()
        return tg.name, 1.0 + 0.1 * randn()
    raise ValueError(f"tiny_dsv4: no generator for tensor group {tg.name!r} (role {tg.role}, dtype "
                     f"{tg.dtype}); add a case to non_matrix_tensor()")


def _tensor(tg: TensorGroup, cfg: dict, seed: int) -> tuple[str, torch.Tensor]:
    """(native tensor name, value in its layout-(a) dtype) for one group."""
    if tg.is_matrix:
        w = _matrix(tg, seed)
        if tg.role in RELEASE_MXFP4_ROLES:
            return tg.name + ".weight", _on_mxfp4_grid(w, tg.name + ".weight")
        return tg.name + ".weight", w.to(torch.bfloat16)
    return non_matrix_tensor(tg, cfg, seed)


def tiny_dsv4_state(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Layout-(a) state dict in native names, in dsv4_spec order (MTP included)."""
    return dict(_tensor(tg, cfg, seed) for tg in dsv4_tensor_groups(cfg))


def release_tensors(name: str, t: torch.Tensor, role: str | None) -> dict[str, torch.Tensor]:
    """One layout-(a) tensor in the release's format: FP8 E4M3 + UE8M0 128x128 for the FP8 roles,
    MXFP4 (packed E2M1 as I8, UE8M0 per 32 as F8_E8M0) for the routed experts, else as it is."""
    from nvfp4stack.formats.fp8_block import quantize_fp8_block
    from nvfp4stack.formats.mxfp4 import quantize_mxfp4

    if not name.endswith(".weight") or t.ndim != 2 or role not in RELEASE_FP8_ROLES | RELEASE_MXFP4_ROLES:
        return {name: t}
    base = name[: -len(".weight")]
    if role in RELEASE_FP8_ROLES:
        q = quantize_fp8_block(t, ue8m0=True, name=name)
        return {name: q.data, base + ".scale": q.scale.view(torch.float8_e8m0fnu)}
    q = quantize_mxfp4(t, name=name)
    return {name: q.data.view(torch.int8), base + ".scale": q.scale.view(torch.float8_e8m0fnu)}


def to_release(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    """Layout (a) -> layout (b): FP8-block and MXFP4 roles quantized, everything else as is."""
    from nvfp4stack.families.registry import role_of

    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        out.update(release_tensors(name, t, role_of(name, "deepseek_v4")))
    return out


def _write_model_dir(path: Path, state: dict[str, torch.Tensor], config: dict, tok_dir: Path) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in sorted(tok_dir.iterdir()):
        shutil.copy2(f, path / f.name)


def _write_hf_layout(bf16_dir: Path, out: Path) -> None:
    """Layout (c): load (a) with transformers and let it save itself."""
    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM.from_pretrained(bf16_dir, dtype=torch.bfloat16)
    model.save_pretrained(out)
    for f in bf16_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy2(f, out / f.name)


def write_layouts(root: Path, state: dict[str, torch.Tensor], cfg: dict, tok_dir: Path) -> None:
    """The three layouts of ``state`` (layout-(a) names and dtypes) under ``root``."""
    _write_model_dir(root / "bf16", state, cfg, tok_dir)
    _write_model_dir(root / "release", to_release(state, cfg), release_config(cfg), tok_dir)
    _write_hf_layout(root / "bf16", root / "hf")


def on_mxfp4_grid(w: torch.Tensor, name: str) -> torch.Tensor:
    """``w`` rounded to the MXFP4 grid, as exact BF16: what a trained routed expert is stored as."""
    return _on_mxfp4_grid(w, name)


def layout_dir(root: Path, layout: str) -> Path:
    if layout not in LAYOUTS:
        raise ValueError(f"tiny_dsv4 layout {layout!r} is unknown; valid: {', '.join(LAYOUTS)}")
    return Path(root) / layout


def build_tiny_dsv4(cache_dir: str | Path, seed: int = 0) -> Path:
    """Build (or reuse) the tiny DeepSeek-V4 in all layouts; returns its root directory.

    Idempotent and atomic: built in a temporary sibling directory, then renamed; a finished build
    under the same (seed, SPEC_VERSION) is returned as is.
    """
    cache_dir = Path(cache_dir)
    root = cache_dir / f"tiny_dsv4-v{SPEC_VERSION}-s{seed}"
    if (root / "bf16" / "config.json").exists():
        return root  # before importing transformers: a plan or convert of a built tiny needs none of it
    from transformers import AutoTokenizer

    from nvfp4stack.models.tokenizer import train_tokenizer

    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=cache_dir))
    try:
        tok_dir = train_tokenizer(tmp / "tokenizer", TOKENIZER_VOCAB)
        tok = AutoTokenizer.from_pretrained(tok_dir)
        vocab = 64 * math.ceil(len(tok) / 64)  # padded like real vocabularies; extra rows are unused
        cfg = tiny_dsv4_config(vocab, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
        write_layouts(tmp, tiny_dsv4_state(cfg, seed), cfg, tok_dir)
        try:
            tmp.rename(root)
        except OSError:
            if not (root / "bf16" / "config.json").exists():  # not a concurrent finished build
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return root
