"""DeepSeek-V4 (Flash, Pro): the flagship family; everything the core asks of it, by lazy import."""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.families.family import ModelFamily
from nvfp4stack.models.deepseek_v3.family import MLA_ATTN_PATTERNS, nextn_predict_layers

WO_A = "attn.wo_a"


def _tiny(cache: Path, source_format: str, trained: bool = False) -> Path:
    from nvfp4stack.models.deepseek_v4.tiny import build_tiny_dsv4, layout_dir

    if trained:
        from nvfp4stack.models.deepseek_v4.train import train_tiny_dsv4
        from nvfp4stack.train.config import TrainConfig

        root = train_tiny_dsv4(cache / "models", TrainConfig())
    else:
        root = build_tiny_dsv4(cache / "models")
    return layout_dir(root, "release" if source_format == "official" else "bf16")


class DeepseekV4Family(ModelFamily):
    name = "deepseek_v4"
    hf_architectures = ("DeepseekV4ForCausalLM",)
    model_types = ("deepseek_v4",)
    attn_roles = ("attn.wq_a", "attn.wq_b", "attn.wkv", WO_A, "attn.wo_b")
    extra_roles = ("compressor", "indexer.wq_b", "indexer.weights_proj")
    non_matrix_roles = ("mhc", "attn_sink")
    # Order matters: the compressor (also under the indexer) before the attention projections.
    # Native and unified names put the MoE under 'ffn' (experts' w1/w2/w3 sit below experts. and
    # shared_experts.), transformers' under 'mlp' (generic patterns); the router bias is 'ffn.gate.bias'
    # natively, 'mlp.gate.e_score_correction_bias' in transformers; hash-routed layers store tid2eid.
    role_patterns = (
        ("compressor", r"\.compressor\."),
        ("indexer.wq_b", r"\.indexer\.wq_b(\.|$)"),
        ("indexer.weights_proj", r"\.indexer\.weights_proj(\.|$)"),
        ("gate.bias", r"\.ffn\.gate\.(bias|tid2eid)$|\.mlp\.gate\.(tid2eid|e_score_correction_bias)$"),
        ("shared_experts", r"\.ffn\.shared_experts(\.|$)"),
        ("routed_experts", r"\.ffn\.experts(\.|$)"),
        ("gate", r"\.ffn\.gate(\.weight|$)"),
        *MLA_ATTN_PATTERNS,
        (WO_A, r"\.(attn|self_attn)\.wo_a(\.|$)"),
        ("attn_sink", r"\.attn_sink$|\.sinks$"),
        ("mhc", r"(^|\.)hc_(attn|ffn|head)_(fn|base|scale)$"),
        ("mtp.proj", r"(^|\.)(e_proj|h_proj)(\.|$)"),   # mtp.<N>.e_proj / h_proj
        ("embed", r"(^|\.)embed(\.weight)?$"),          # native top-level names
        ("head", r"(^|\.)head(\.weight)?$"),
    )
    # vLLM builds the compressor and the indexer's weights_proj with quant_config=None.
    unquantized_roles = ("compressor", "indexer.weights_proj")
    # Column/RowParallel or vocab-parallel in vLLM's DeepSeek-V4; the fused wq_a/wkv, the compressor,
    # the indexer, norms and mHC are replicated on every GPU.
    tp_sharded_roles = ("attn.wq_b", WO_A, "attn.wo_b", "shared_experts", "embed", "head")
    # Routed experts are per-expert w1 (gate), w2 (down), w3 (up) in the native and unified layouts
    # (transformers' own layout fuses them into one gate_up_proj, no pair to share a scale).
    gate_up_pairs = (("w1", "w3"),)
    # 'official': DeepSeek's release layout (FP8 block attention / shared experts / MTP, MXFP4 experts).
    source_formats = ("official",)
    mtp_module = "mtp"  # native MTP block: mtp.0.*, after the decoder layers
    # tiny_dsv4 stays random (most tests build on it); tiny_dsv4_trained is the same model trained.
    shape_twins = {"tiny_dsv4_trained": "tiny_dsv4"}
    trainable = ("tiny_dsv4", "tiny_dsv4_trained")
    # The eager transformers forward (mHC, compressor, indexer) runs many times fewer tokens/s than the
    # tiny DeepseekV3 (623 on shared cores): 100 steps learn the frequent words and give the fidelity
    # harness non-uniform distributions, cheap enough to train on demand.
    train_budgets = {"tiny_dsv4": (100, "329 s on 2 shared cores")}
    export_formats = {"dsv4": ("modelopt", "cast")}  # modelopt's DeepSeek-V4 layout
    converter_modules = ("nvfp4stack.models.deepseek_v4.compressor_fuse",)
    vllm_quant_methods = ("deepseek_v4_fp8",)   # DeepseekV4FP8Config: the release's FP8 + MXFP4 format
    vllm_tokenizer_modes = ("deepseek_v4",)
    eval_levels = ("layertest", "e2e")

    def check_hard_rules(self, group, source, target) -> None:
        from nvfp4stack.plan.planner import PlanError
        from nvfp4stack.schemes import Scheme

        if group.role == WO_A and target in (Scheme.NVFP4, Scheme.NVFP4_W4A16, Scheme.MXFP4):
            raise PlanError(
                f"{group.name} (role {group.role}): wo_a cannot be {target.value} under vLLM's DeepSeek-V4 (its "
                "o_proj reads the weight directly as a grouped bmm): expected fp8_block or bf16. Fix: "
                "precision.attn.wo_a=fp8_block")

    def factories(self):
        return {"tiny_dsv4": _tiny, "tiny_dsv4_trained": lambda cache, fmt: _tiny(cache, fmt, trained=True)}

    def train(self, factory: str, cache_root: Path, train_cfg) -> tuple[Path, bool]:
        from nvfp4stack.models.deepseek_v4.train import ensure_trained_tiny_dsv4

        return ensure_trained_tiny_dsv4(cache_root / "models", train_cfg)

    def tensor_groups(self, hf: dict):
        from nvfp4stack.models.deepseek_v4.spec import dsv4_tensor_groups

        return dsv4_tensor_groups(hf)

    def source_scheme(self, group, source_format: str):
        from nvfp4stack.models.deepseek_v4.spec import source_scheme

        return source_scheme(group, source_format)

    def mtp_layers(self, hf: dict) -> int:
        return nextn_predict_layers(hf)

    def kv_cache(self, hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int, tp: int = 1,
                 model_dtype: str | None = None):
        # one latent KV head: every TP rank holds the whole cache, whatever tp is; auto is fp8_ds_mla
        # whatever dtype the model runs in (resolve_kv_dtype), so model_dtype changes nothing here
        from nvfp4stack.models.deepseek_v4.kv_cache import dsv4_cache_lines, resolve_kv_dtype

        return resolve_kv_dtype(kv_dtype), dsv4_cache_lines(hf, kv_dtype, block_size, mtp_layers)

    def kv_pool_layers(self, hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int):
        # vLLM 0.26 sizes this model's cache by its packed pool (plan.kv_pool), not by bytes per token
        from nvfp4stack.models.deepseek_v4.kv_cache import dsv4_layer_specs

        return dsv4_layer_specs(hf, kv_dtype, block_size, mtp_layers)

    def served_config(self, src_config: dict, groups: list) -> dict | None:
        from nvfp4stack.models.deepseek_v4.config_fixups import FP8_CONFIG_LINEAR_ROLES, served_config
        from nvfp4stack.schemes import Scheme

        stored = {g.name: g.source if g.target is Scheme.PASSTHROUGH else g.target for g in groups}
        bf16 = [g.name for g in groups if g.role in FP8_CONFIG_LINEAR_ROLES and stored[g.name] is Scheme.BF16]
        return served_config(src_config, {(g.role, g.target) for g in groups if g.converter}, bf16)

    def register_vllm(self, platform: str) -> None:
        if platform == "cuda":   # vLLM 0.26: the mHC and indexer-metadata kernels compiled at start, not mid-serving
            from nvfp4stack.models.deepseek_v4 import indexer_warmup
            from nvfp4stack.models.deepseek_v4.mhc_warmup import install

            install()
            indexer_warmup.register()

    def check_checkpoint(self, config: dict, tensors: dict, report) -> bool:
        from nvfp4stack.models.deepseek_v4.doctor import check_checkpoint

        return check_checkpoint(config, tensors, report)

    def vllm_load_check(self, ckpt: Path, report, mode: str) -> None:
        from nvfp4stack.models.deepseek_v4.doctor import vllm_load_check

        vllm_load_check(ckpt, report, mode)

    def synthetic_weights(self, config: dict, seed: int, device, draft: bool = False):
        from nvfp4stack.models.deepseek_v4.synthetic import release_stream

        return release_stream(config, seed, device, mtp_only=draft)

    def quantize(self, cfg) -> int:
        from nvfp4stack.models.deepseek_v4.quantize import run

        return run(cfg)

    def fidelity(self, cfg, seed: int) -> dict:
        from nvfp4stack.models.deepseek_v4.fidelity import fidelity

        return fidelity(cfg, seed)

    def served_reference(self, bf16_dir: Path, served_dir: Path):
        from nvfp4stack.models.deepseek_v4.reference import served_reference

        return served_reference(bf16_dir, served_dir)
