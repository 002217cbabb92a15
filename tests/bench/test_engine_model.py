"""The synthetic engine-benchmark checkpoint (Flash expert shapes on the GPU host; small here):
its BF16 variant loads into transformers' DeepseekV3ForCausalLM with no missing or unexpected
weights, and its NVFP4 variant's experts dequantize to the BF16 variant's within NVFP4's error and
plan as NVFP4 routed experts."""
import json

import pytest
import torch

from nvfp4stack.models.deepseek_v3.bench_model import EngineModelSpec, build

SMALL = EngineModelSpec(hidden_size=256, moe_intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2,
                        intermediate_size=512, num_attention_heads=4, q_lora_rank=64, n_group=2, topk_group=1)


def test_bf16_variant_is_a_complete_deepseek_v3_checkpoint(tmp_path):
    from transformers import DeepseekV3ForCausalLM

    out = build(tmp_path / "bf16", "bf16", SMALL, device="cpu")
    model, info = DeepseekV3ForCausalLM.from_pretrained(out, dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.n_routed_experts == 8 and model.config.moe_intermediate_size == 64


def test_nvfp4_variant_matches_bf16_and_plans_as_nvfp4_experts(tmp_path):
    from nvfp4stack.checkpoint.safetensors_io import ShardedReader
    from nvfp4stack.formats.nvfp4 import dequantize_nvfp4
    from nvfp4stack.plan.groups import groups_from_checkpoint
    from nvfp4stack.schemes import Scheme

    bf16 = ShardedReader(build(tmp_path / "bf16", "bf16", SMALL, device="cpu"))
    q = ShardedReader(build(tmp_path / "q", "nvfp4", SMALL, device="cpu"))   # same seed: same weights
    p = "model.layers.1.mlp.experts.3"
    assert torch.equal(q.get(f"{p}.gate_proj.weight_scale_2"), q.get(f"{p}.up_proj.weight_scale_2"))
    for proj in ("gate_proj", "up_proj", "down_proj"):
        w = dequantize_nvfp4(q.get(f"{p}.{proj}.weight"), q.get(f"{p}.{proj}.weight_scale"),
                             q.get(f"{p}.{proj}.weight_scale_2"), torch.float32)
        ref = bf16.get(f"{p}.{proj}.weight").float()
        rel = ((w - ref).norm() / ref.norm()).item()
        assert 0 < rel < 0.12, (proj, rel)
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_algo"] == "NVFP4" and "model.layers.0*" in cfg["quantization_config"]["ignore"]
    experts = [s for g, s in groups_from_checkpoint(tmp_path / "q", 3) if g.role == "routed_experts"]
    assert len(experts) == 8 * 3 * 2 and set(experts) == {Scheme.NVFP4}


def test_rejects_unknown_expert_format(tmp_path):
    with pytest.raises(ValueError, match="nvfp4 or bf16"):
        build(tmp_path / "x", "fp8", SMALL, device="cpu")


@pytest.mark.parametrize("experts", ["nvfp4", "bf16"])
def test_checkpoint_bytes_is_what_build_writes(tmp_path, experts):
    from nvfp4stack.models.deepseek_v3.bench_model import checkpoint_bytes

    out = build(tmp_path / experts, experts, SMALL, device="cpu")
    payload = 0
    for shard in out.glob("*.safetensors"):
        with open(shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        payload += sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items() if k != "__metadata__")
    assert payload == checkpoint_bytes(SMALL, experts) > 0


def test_refuses_a_build_that_does_not_fit_and_writes_nothing(tmp_path, monkeypatch):
    from collections import namedtuple

    from nvfp4stack.models.deepseek_v3 import bench_model

    usage = namedtuple("usage", "total used free")
    probed = []
    monkeypatch.setattr(bench_model.shutil, "disk_usage",
                        lambda p: probed.append(p) or usage(10**12, 10**12 - 10**6, 10**6))
    with pytest.raises(ValueError) as e:
        build(tmp_path / "cache" / "bf16", "bf16", SMALL, device="cpu")
    msg = str(e.value)
    assert "synthetic bf16 checkpoint of 3 layers" in msg and "0.0 GB free" in msg
    assert "bench.engine_model_layers" in msg and "leave bf16 out of bench.engine_settings" in msg
    assert probed == [tmp_path]   # the nearest existing parent of the output
    assert not (tmp_path / "cache").exists() and list(tmp_path.iterdir()) == []


def test_free_space_counts_a_margin_and_the_copy_being_replaced(tmp_path, monkeypatch):
    from collections import namedtuple

    from nvfp4stack.models.deepseek_v3 import bench_model

    need = bench_model.checkpoint_bytes(SMALL, "nvfp4")
    usage = namedtuple("usage", "total used free")
    free = [need]   # the bare tensor bytes: no room for the headers
    monkeypatch.setattr(bench_model.shutil, "disk_usage", lambda p: usage(10**12, 0, free[0]))
    with pytest.raises(ValueError, match="synthetic nvfp4 checkpoint"):
        build(tmp_path / "q", "nvfp4", SMALL, device="cpu")
    free[0] = need + need // 50 + (64 << 20)
    out = build(tmp_path / "q", "nvfp4", SMALL, device="cpu")   # exactly enough
    with pytest.raises(ValueError, match="synthetic nvfp4 checkpoint"):   # the old copy stays until the rename
        build(out, "nvfp4", SMALL, device="cpu")
    assert (out / "config.json").exists()


@pytest.mark.parametrize("experts", ["nvfp4", "bf16"])
def test_the_drawn_model_is_the_built_checkpoint_without_the_files(tmp_path, experts):
    """bench.engine_model=drawn: the weight-free directory's config.json gives, with no file read, the headers
    (names, dtypes, shapes), the tensor groups, the tensors (engine.load_format=synthetic's stream, same seed and
    device) and the engine plan of the checkpoint ``build`` writes."""
    from safetensors.torch import load_file

    from nvfp4stack.cli import compose_config
    from nvfp4stack.engine.args import server_argv
    from nvfp4stack.engine.plan_section import engine_plan_for
    from nvfp4stack.families.registry import get_family
    from nvfp4stack.models.deepseek_v3.bench_model import headers, synthetic_weights, write_model_files
    from nvfp4stack.plan.groups import checkpoint_tensors, groups_from_checkpoint

    disk = build(tmp_path / experts, experts, SMALL, device="cpu")
    bare = tmp_path / f"{experts}-drawn"
    bare.mkdir()
    write_model_files(bare, SMALL, experts, None)
    assert sorted(p.name for p in bare.iterdir()) == sorted(p.name for p in disk.iterdir() if p.suffix != ".safetensors"
                                                            and not p.name.endswith(".index.json"))
    config = json.loads((bare / "config.json").read_text())
    assert config == json.loads((disk / "config.json").read_text())
    on_disk = checkpoint_tensors(disk)
    assert headers(SMALL, experts) == {n: {"dtype": i["dtype"], "shape": i["shape"]} for n, i in on_disk.items()}
    family = get_family("deepseek_v3")
    assert family.tensor_groups(config) == [g for g, _ in groups_from_checkpoint(disk, SMALL.num_hidden_layers, family)]
    files = {}
    for shard in disk.glob("*.safetensors"):
        files |= load_file(str(shard))
    drawn = dict(synthetic_weights(config, 0, "cpu"))
    assert drawn.keys() == files.keys() and all(torch.equal(drawn[k], files[k]) for k in files)
    prec = ["precision.routed_experts=bf16"] if experts == "bf16" else []
    common = ("recipe=tiny_v3_h200", f"cache_dir={tmp_path / 'cache'}", "run_dir=/tmp/unused", *prec)
    from_files = compose_config(*common, f"model.path={disk}")
    from_bare = compose_config(*common, f"model.path={bare}", "engine.load_format=synthetic",
                               f"model.source_format={'modelopt' if experts == 'nvfp4' else 'bf16'}")
    plan = engine_plan_for(from_bare)
    assert plan == engine_plan_for(from_files)
    argv = server_argv(from_bare.engine, model=str(bare), served_name="x", plan=plan)
    assert argv[argv.index("--load-format") + 1] == "synthetic"


def test_configs_the_spec_does_not_list_plan_from_files_and_draw_nothing(tmp_path):
    from nvfp4stack.families.registry import get_family
    from nvfp4stack.models.deepseek_v3.bench_model import experts_of, hf_config, synthetic_weights

    family = get_family("deepseek_v3")
    config = hf_config(SMALL)
    assert family.tensor_groups(config) is not None
    for bad, said in (({"num_nextn_predict_layers": 1}, "num_nextn_predict_layers: expected 0, found 1"),
                      ({"q_lora_rank": None}, "q_lora_rank: missing"),
                      ({"rope_theta": 50000.0}, "rope_theta: expected 10000.0, found 50000.0")):   # another model
        assert family.tensor_groups({**config, **bad}) is None   # plan_groups then asks for the checkpoint
        assert family.config_source_format({**config, **bad}) is None
        with pytest.raises(ValueError, match=rf"not the synthetic benchmark model's \({said}\).*fix: serve it from its "
                                             "checkpoint files"):
            synthetic_weights({**config, **bad}, 0, "cpu")
    fp8 = {**config, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    with pytest.raises(ValueError, match=r"c\.json: quantization_config 'fp8'/None.*BF16 experts.*modelopt NVFP4"):
        experts_of(fp8, "c.json")
    with pytest.raises(ValueError, match="no MTP layers.*fix: engine.speculative unset"):
        family.synthetic_weights(config, 0, "cpu", draft=True)
    with pytest.raises(ValueError, match="quantization_config 'fp8'"):
        family.tensor_groups(fp8)


def test_a_weight_free_plan_takes_the_source_format_its_config_declares(tmp_path):
    """No weight files to read the format from: a model.source_format other than the config's quantization_config
    is refused, naming the key and the fix, rather than planned as BF16 weights to convert."""
    from nvfp4stack.cli import compose_config
    from nvfp4stack.engine.plan_section import engine_plan_for
    from nvfp4stack.models.deepseek_v3.bench_model import write_model_files

    bare = tmp_path / "drawn"
    bare.mkdir()
    write_model_files(bare, SMALL, "nvfp4", None)
    cfg = compose_config("recipe=tiny_v3_h200", f"model.path={bare}", "engine.load_format=synthetic",
                         f"cache_dir={tmp_path / 'cache'}", "run_dir=/tmp/unused")
    assert cfg.model.source_format == "bf16"
    with pytest.raises(ValueError, match=r"model.source_format='bf16': the weight-free config.json .* declares "
                                         r"'modelopt' weights .*fix: model.source_format=modelopt"):
        engine_plan_for(cfg)
