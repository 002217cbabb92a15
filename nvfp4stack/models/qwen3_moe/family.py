"""Qwen3-MoE (``Qwen3MoeForCausalLM``: GQA with q/k RMSNorm, no shared expert, softmax top-k routing):
everything the core asks of this family."""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.families.family import ModelFamily
from nvfp4stack.schemes import Scheme


class Qwen3MoeFamily(ModelFamily):
    name = "qwen3_moe"
    hf_architectures = ("Qwen3MoeForCausalLM",)
    model_types = ("qwen3_moe",)
    # precision.attn.{q_proj,k_proj,v_proj,o_proj}; vLLM fuses q/k/v into one qkv_proj, so give them one scheme
    attn_roles = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj")
    role_patterns = tuple((f"attn.{p}", rf"\.self_attn\.{p}(\.|$)") for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    # vLLM's Qwen3-MoE: QKVParallelLinear / RowParallelLinear attention, vocab-parallel embed and head.
    # (K/V heads are replicated once engine.tp exceeds num_key_value_heads: counted sharded here.)
    tp_sharded_roles = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "embed", "head")
    serve_factories = ("tiny_qwen3_moe",)
    eval_levels = ("e2e",)

    def check_hard_rules(self, group, source, target) -> None:
        """Only the routed experts are quantized on this family: modelopt's experts-only export (what
        ``quantize`` and ``serve`` write) and the config ``convert`` writes exclude every other module."""
        from nvfp4stack.plan.planner import PlanError

        if group.is_matrix and group.role != "routed_experts" and target not in (Scheme.BF16, Scheme.PASSTHROUGH):
            raise PlanError(
                f"{group.name} (role {group.role}): a Qwen3-MoE serves only its routed experts quantized (modelopt "
                f"NVFP4_EXPERTS_ONLY_CFG; attention, router, embed and head stay BF16), found {target.value}. "
                f"Fix: precision.{group.role}=bf16")

    # -- models ------------------------------------------------------------------------------
    def factories(self):
        from nvfp4stack.models.qwen3_moe.pipeline import FACTORY, build_factory

        return {FACTORY: build_factory}

    # -- planning ----------------------------------------------------------------------------
    def tensor_groups(self, hf: dict):
        from nvfp4stack.models.qwen3_moe.spec import qwen3_moe_tensor_groups

        return list(qwen3_moe_tensor_groups(hf))

    # source_scheme: the generic one (Qwen releases BF16; a modelopt export has NVFP4 routed experts)

    def kv_cache(self, hf: dict, kv_dtype: str, block_size: int | None, mtp_layers: int, tp: int = 1,
                 model_dtype: str | None = None):
        from nvfp4stack.models.qwen3_moe.spec import qwen3_moe_cache_lines

        return qwen3_moe_cache_lines(hf, kv_dtype, block_size, tp, model_dtype)

    # -- checkpoints, vLLM -------------------------------------------------------------------
    def served_config(self, src_config: dict, groups: list) -> dict | None:
        from nvfp4stack.models.qwen3_moe.pipeline import served_config

        return served_config(src_config, groups)

    def check_checkpoint(self, config: dict, tensors: dict, report) -> bool:
        from nvfp4stack.models.qwen3_moe.doctor import check_checkpoint

        return check_checkpoint(config, tensors, report)

    def serve_checkpoint(self, cfg, plan, build: bool = True) -> Path | None:
        from nvfp4stack.models.qwen3_moe.pipeline import serve_checkpoint

        return serve_checkpoint(cfg, plan, build)

    def quantize(self, cfg) -> int:
        from nvfp4stack.models.qwen3_moe.pipeline import quantize

        return quantize(cfg)

    # -- fidelity ----------------------------------------------------------------------------
    def fidelity(self, cfg, seed: int) -> dict:
        if cfg.eval.level not in self.eval_levels:
            raise self.capability_missing(f"eval.level={cfg.eval.level}", f"eval.level={cfg.eval.level!r}",
                                f"one of {', '.join(self.eval_levels)}")
        from nvfp4stack.models.qwen3_moe.reference import fidelity_e2e

        return fidelity_e2e(cfg, seed)

    def served_reference(self, bf16_dir: Path, served_dir: Path):
        from nvfp4stack.models.qwen3_moe.reference import reference_model

        return reference_model(bf16_dir, served_dir, w4a4=False)
