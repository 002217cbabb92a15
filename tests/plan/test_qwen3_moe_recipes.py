"""The Qwen3-235B-A22B recipes (8x H200, 4x B200): memory plan from the weight-free descriptor, and the
dry-run engine command checked against vLLM's own OpenAI-server parser (like the DeepSeek recipes)."""
import json

import pytest

from nvfp4stack.cli import compose_config
from nvfp4stack.engine.args import SERVER_MODULE, format_cli, server_argv
from nvfp4stack.engine.plan_section import EnginePlan, engine_plan_for
from nvfp4stack.plan.build import plan_for_config
from tests.engine.test_args import fake_checkpoint, parse_with_vllm, vllm_parser  # noqa: F401  (fixture)

GB = 1e9
EXPERT_BYTES = 94 * 128 * 3 * 4096 * 1536 * (0.5 + 1 / 16)    # E2M1 + one UE4M3 per 16 (+ scalars)


@pytest.mark.parametrize("recipe,gpus,backend,served", [("qwen3_235b_h200", 8, "triton_w4a16", "nvfp4_w4a16"),
                                                         ("qwen3_235b_b200", 4, "flashinfer_trtllm", "nvfp4")])
def test_memory_plan(recipe, gpus, backend, served, tmp_path, capsys):
    from nvfp4stack.tasks.plan import run

    cfg = compose_config(f"recipe={recipe}", f"run_dir={tmp_path}")
    plan = plan_for_config(cfg)
    assert plan.family == "qwen3_moe" and round(plan.total_params / 1e9) == 235
    experts = [g for g in plan.groups if g.role == "routed_experts"]
    assert len(experts) == 94 * 128 * 3 and {(g.kernel, g.served.value, g.converter) for g in experts} == {
        (backend, served, None)}                       # the modelopt export is served as stored
    assert {g.served.value for g in plan.groups if g.kernel != "-" and g.role != "routed_experts"} == {"bf16"}
    expert_bytes = sum(g.bytes for g in experts)
    assert abs(expert_bytes - EXPERT_BYTES) / EXPERT_BYTES < 1e-3
    # EP spreads the experts over every GPU; attention, embed and head are split over TP ranks
    assert plan.gpu_bytes < plan.total_bytes / gpus * 1.05
    assert run(cfg) == 0
    out = capsys.readouterr().out
    kv = json.loads((tmp_path / "plan.json").read_text())["kv_cache"]
    assert kv["stored_as"] == "fp8" and kv["bytes_per_token"] == 94 * 2 * 1 * 128   # one of 4 KV heads per GPU
    assert kv["max_context_one_seq"] == 32768 and kv["max_batch_at_max_len"] > 100
    assert "KV cache per GPU" in out and "max KV tokens that fit" in out


@pytest.mark.parametrize("recipe,moe_flag", [("qwen3_235b_b200", "flashinfer_trtllm"), ("qwen3_235b_h200", None)])
def test_engine_args_accepted_by_vllm_parser(recipe, moe_flag, vllm_parser, tmp_path):  # noqa: F811
    cfg = compose_config(f"recipe={recipe}", "run_dir=/tmp/unused")
    plan = engine_plan_for(cfg)
    ckpt = fake_checkpoint(tmp_path, {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]})
    argv = server_argv(cfg.engine, model=str(ckpt), served_name=cfg.model.served_name, plan=plan)
    print(format_cli(argv))
    assert argv[1:3] == ["-m", SERVER_MODULE]
    ns, ea = parse_with_vllm(vllm_parser, argv[3:])
    assert ea.tensor_parallel_size == (4 if moe_flag else 8) and ea.enable_expert_parallel is True
    assert ea.kv_cache_dtype == "fp8" and ea.max_model_len == 32768 and ea.gpu_memory_utilization == 0.9
    assert ea.reasoning_parser == "qwen3" and ns.tool_call_parser == "hermes" and ns.enable_auto_tool_choice
    if moe_flag:   # vLLM's own NVFP4 MoE backend, chosen by vLLM's flag; no nvfp4stack quant config
        assert ea.moe_backend == moe_flag and "--quantization" not in argv
    else:          # nvfp4stack's Triton W4A16 kernel through the plugin, the plan in --hf-overrides
        assert ea.quantization == "nvfp4stack" and "--moe-backend" not in argv
        section = ea.hf_overrides["quantization_config"]["nvfp4stack"]
        assert EnginePlan.from_dict(section).roles == plan.roles and section["family"] == "qwen3_moe"
        assert plan.entry_for("model.layers.93.self_attn.o_proj") == {"scheme": "bf16", "kernel": "unquantized"}
        assert plan.own_kernel("model.layers.93.mlp.experts", "moe") == "triton_w4a16"


def test_qwen3_parsers_are_registered_in_vllm():
    pytest.importorskip("vllm")
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    assert "qwen3" in ReasoningParserManager.list_registered()
    assert "hermes" in ToolParserManager.list_registered()


@pytest.mark.parametrize("key", ["precision.attn.q_proj=fp8_block", "precision.gate=nvfp4", "precision.head=fp8_block"])
def test_only_routed_experts_are_quantized(key, tmp_path):
    """What quantize, serve and convert write keeps everything but the routed experts BF16: the plan refuses
    another target in one line naming the tensor, the role and the key to set (plan and serve alike)."""
    from nvfp4stack.plan.planner import PlanError

    cfg = compose_config("recipe=qwen3_235b_b200", f"run_dir={tmp_path}", key)
    role = key.split("=")[0].removeprefix("precision.")
    with pytest.raises(PlanError, match=rf"\(role {role}\): a Qwen3-MoE serves only its routed experts quantized"
                                        rf".*Fix: precision\.{role}=bf16"):
        plan_for_config(cfg)
    with pytest.raises(PlanError, match=rf"Fix: precision\.{role}=bf16"):
        engine_plan_for(cfg)


@pytest.mark.parametrize("recipe", ["qwen3_235b_h200", "qwen3_235b_b200"])
def test_quantize_on_the_full_size_recipes_takes_the_family_path(recipe):
    """`quantize` on a Qwen3 recipe needs modelopt into the unified HF export (the family refuses the
    default, DeepSeek-V4's layout): the recipes say so, as the tiny one does."""
    cfg = compose_config(f"recipe={recipe}", "run_dir=/tmp/unused")
    assert (cfg.quantize.method, cfg.quantize.export_format) == ("modelopt", "hf_unified")


def test_tiny_recipe_kv_cache_is_the_served_float32(tmp_path):
    """tiny_qwen3_moe serves engine.dtype=float32 with kv_cache_dtype=auto: its KV cache is float32
    (config.json says bfloat16; vLLM caches the dtype the engine runs)."""
    from nvfp4stack.tasks.plan import run

    cfg = compose_config("recipe=tiny_qwen3_moe", f"run_dir={tmp_path}")
    assert (cfg.engine.dtype, cfg.engine.kv_cache_dtype) == ("float32", "auto")
    assert run(cfg) == 0
    kv = json.loads((tmp_path / "plan.json").read_text())["kv_cache"]
    assert (kv["stored_as"], kv["model_dtype"]) == ("float32", "float32")
    (line,) = kv["caches"]
    assert kv["bytes_per_token"] == line["layers"] * 2 * 2 * 64 * 4      # K and V, 2 heads of 64, 4 bytes
