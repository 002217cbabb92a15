"""The DeepseekV3 architecture (MLA, shared expert, noaux_tc routing): the tiny model ``serve`` runs."""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.families.family import ModelFamily

# MLA attention projections in transformers' and vLLM's names (DeepSeek-V4's native names too):
# q_a / fused q_a+kv_a -> wq_a, q_b (or q without q_lora) -> wq_b, kv_a -> wkv, kv_b -> wkv_b, o -> wo_b.
MLA_ATTN_PATTERNS: tuple[tuple[str, str], ...] = (
    ("attn.wq_a", r"\.(attn|self_attn)\.(wq_a|q_a_proj|fused_wqa_wkv|fused_qkv_a_proj)(\.|$)"),
    ("attn.wq_b", r"\.(attn|self_attn)\.(wq_b|q_b_proj|q_proj)(\.|$)"),
    ("attn.wkv", r"\.(attn|self_attn)\.(wkv|kv_a_proj_with_mqa)(\.|$)"),
    ("attn.wkv_b", r"\.(attn|self_attn)\.kv_b_proj(\.|$)"),
    ("attn.wo_b", r"\.(attn|self_attn)\.(wo_b|o_proj)(\.|$)"),
)
# vLLM splits these across tensor-parallel ranks (Column/RowParallel, vocab-parallel).
MLA_TP_SHARDED = ("attn.wq_b", "attn.wkv_b", "attn.wo_b", "shared_experts", "embed", "head")


def nextn_predict_layers(hf: dict) -> int:
    """DeepSeek's MTP layer count: config.json ``num_nextn_predict_layers`` (0 when absent)."""
    return int(hf.get("num_nextn_predict_layers") or 0)


def _tiny(cache: Path, source_format: str, trained: bool = True) -> Path:
    from nvfp4stack.models.deepseek_v3.tiny import ensure_tiny_v3

    return ensure_tiny_v3(cache / "tiny_v3", trained=trained)


class DeepseekV3Family(ModelFamily):
    name = "deepseek_v3"
    hf_architectures = ("DeepseekV3ForCausalLM",)
    model_types = ("deepseek_v3",)
    attn_roles = ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wkv_b", "attn.wo_b")
    # transformers' and vLLM's DeepseekV3 names: the noaux_tc router bias, and the MTP layers (decoder
    # layers past num_hidden_layers) with their eh_proj and shared_head.head.
    role_patterns = (
        *MLA_ATTN_PATTERNS,
        ("gate.bias", r"\.mlp\.gate\.e_score_correction_bias$"),
        ("mtp.proj", r"(^|\.)eh_proj(\.|$)"),
        ("head", r"\.shared_head\.head(\.weight)?$"),
    )
    tp_sharded_roles = MLA_TP_SHARDED
    # tiny_v3 (what `serve` runs) is trained on the stdlib corpus on first use; tiny_v3_random is its
    # seeded random twin, for shapes and loaders.
    shape_twins = {"tiny_v3": "tiny_v3_random"}
    trainable = ("tiny_v3", "tiny_v3_random")
    serve_factories = ("tiny_v3",)
    # ~2.9M parameters: 600 steps, 158 s at 7,778 tokens/s on 2 free cores (measured 2026-11-24, README
    # "Train the tiny models"; 1030 s when the cores were shared), held-out perplexity 28.5 on that AMD
    # EPYC Zen 5 (29.05 on an AMX host: kernels differ by ISA) (goal <= vocab/20 = 51; 350 steps gave
    # 41.8, with visibly more broken words in served replies).
    train_budgets = {"tiny_v3": (600, "158 s on 2 free cores, much longer when they are shared")}
    eval_levels = ("e2e",)

    def factories(self):
        return {"tiny_v3": _tiny, "tiny_v3_random": lambda cache, fmt: _tiny(cache, fmt, trained=False)}

    def mtp_layers(self, hf: dict) -> int:
        return nextn_predict_layers(hf)

    def kv_cache(self, hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int, tp: int = 1,
                 model_dtype: str | None = None):
        # one latent KV head: every TP rank holds the whole cache, whatever tp is
        from nvfp4stack.models.deepseek_v3.kv_cache import mla_cache_lines

        return mla_cache_lines(hf, kv_dtype, block_size, mtp_layers, model_dtype)

    def train(self, factory: str, cache_root: Path, train_cfg) -> tuple[Path, bool]:
        from nvfp4stack.models.deepseek_v3.tiny import ensure_trained_tiny_v3

        return ensure_trained_tiny_v3(cache_root / "tiny_v3", train=train_cfg)

    def serve_checkpoint(self, cfg, plan, build: bool = True) -> Path | None:
        if cfg.model.factory not in self.serve_factories:
            return None
        from nvfp4stack.models.deepseek_v3.serve import tiny_v3_checkpoint

        return tiny_v3_checkpoint(cfg, plan, build=build)

    def quantize(self, cfg) -> int:
        from nvfp4stack.models.deepseek_v3.quantize import run

        return run(cfg)

    def fidelity(self, cfg, seed: int) -> dict:
        from nvfp4stack.models.deepseek_v3.fidelity import fidelity

        return fidelity(cfg, seed)

    def served_reference(self, bf16_dir: Path, served_dir: Path):
        from nvfp4stack.models.deepseek_v3.tiny import reference_model

        return reference_model(bf16_dir, served_dir, w4a4=False)

    def synthetic_checkpoint(self, root: Path, experts: str, num_layers: int, max_position: int,
                             drawn: bool = False) -> Path:
        from nvfp4stack.models.deepseek_v3.bench_model import synthetic_checkpoint

        return synthetic_checkpoint(root, experts, num_layers, max_position, drawn)

    def synthetic_weights(self, config: dict, seed: int, device, draft: bool = False):
        if draft:
            raise ValueError("engine.load_format=synthetic: the synthetic DeepseekV3 benchmark model has no MTP "
                             "layers to draw a speculative draft from; fix: engine.speculative unset")
        from nvfp4stack.models.deepseek_v3.bench_model import synthetic_weights

        return synthetic_weights(config, seed, device)

    def tensor_groups(self, hf: dict):
        # the synthetic benchmark model's config.json (its weights drawn at load): its tensors are known from the
        # spec; other DeepseekV3 configs plan from their checkpoint's headers
        from nvfp4stack.models.deepseek_v3.bench_model import experts_of, headers, spec_from_config
        from nvfp4stack.plan.groups import groups_from_headers

        spec = spec_from_config(hf)
        if spec is None:
            return None
        experts_of(hf)   # a quantization the model is never drawn in: refused here, naming it
        return [g for g, _ in groups_from_headers(headers(spec, "bf16"), spec.num_hidden_layers, self)]

    def config_source_format(self, hf: dict) -> str | None:
        from nvfp4stack.models.deepseek_v3.bench_model import experts_of, spec_from_config

        if spec_from_config(hf) is None:
            return None
        return "modelopt" if experts_of(hf) == "nvfp4" else "bf16"
