"""The doctor reports a checkpoint whose quantization_config disagrees with its tensors or with the
recipe's plan (issue #18), naming the layers, and is silent when all three agree."""
from __future__ import annotations

import json
import random
import re

import pytest
import torch
from safetensors.torch import save_file

from nvfp4stack.cli import compose_config
from nvfp4stack.doctor.plan import check_plan_agreement, claimed_scheme, modelopt_quant_config
from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.plan.build import plan_for_config
from nvfp4stack.schemes import Scheme

N_LAYERS, N_EXPERTS, HIDDEN, INTER = 4, 2, 64, 32
PROJ = {"gate_proj": (INTER, HIDDEN), "up_proj": (INTER, HIDDEN), "down_proj": (HIDDEN, INTER)}


def _nvfp4(g: torch.Generator, n: int, k: int) -> dict[str, torch.Tensor]:
    """modelopt's NVFP4 tensors of one linear (random bytes: the doctor reads headers here)."""
    return {"weight": torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
            "weight_scale": (torch.rand(n, k // 16, generator=g) * 400 + 1).to(torch.float8_e4m3fn),
            "weight_scale_2": torch.rand((), generator=g) + 1e-3, "input_scale": torch.rand((), generator=g) + 1e-3}


def write_checkpoint(path, bf16_layers: set[int], quant_config: dict | None, seed: int) -> None:
    """A DeepseekV3-named checkpoint: layer 0 dense, layers 1.. MoE with experts NVFP4 except
    ``bf16_layers``; attention BF16 everywhere."""
    g = torch.Generator().manual_seed(seed)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(128, HIDDEN, generator=g).bfloat16()}
    for i in range(N_LAYERS):
        p = f"model.layers.{i}"
        t[f"{p}.self_attn.o_proj.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g).bfloat16()
        t[f"{p}.input_layernorm.weight"] = torch.rand(HIDDEN, generator=g).bfloat16()
        if i == 0:
            for proj, (n, k) in PROJ.items():
                t[f"{p}.mlp.{proj}.weight"] = torch.randn(n, k, generator=g).bfloat16()
            continue
        t[f"{p}.mlp.gate.weight"] = torch.randn(N_EXPERTS, HIDDEN, generator=g).bfloat16()
        for e in range(N_EXPERTS):
            for proj, (n, k) in PROJ.items():
                name = f"{p}.mlp.experts.{e}.{proj}"
                if i in bf16_layers:
                    t[f"{name}.weight"] = torch.randn(n, k, generator=g).bfloat16()
                else:
                    t.update({f"{name}.{s}": v for s, v in _nvfp4(g, n, k).items()})
    path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(path / "model.safetensors"))
    cfg = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": N_LAYERS,
           "hidden_size": HIDDEN}
    if quant_config is not None:
        cfg["quantization_config"] = quant_config
    (path / "config.json").write_text(json.dumps(cfg))


def modelopt_ignore(excluded_layers: set[int]) -> dict:
    """modelopt's NVFP4 export config: the BF16 expert layers in its ignore list (as the export writes it)."""
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": {"name": "modelopt"},
            "ignore": ["lm_head", "model.embed_tokens", "model.layers.0*",
                       *(f"model.layers.{i}.mlp.gate" for i in range(1, N_LAYERS)),
                       *(f"model.layers.{i}.self_attn*" for i in range(1, N_LAYERS)),
                       *(f"model.layers.{i}.mlp.experts*" for i in sorted(excluded_layers))]}


def modelopt_mixed(nvfp4_layers: set[int]) -> dict:
    """modelopt's MIXED_PRECISION form: only the quantized modules are listed."""
    layers = {f"model.layers.{i}.mlp.experts.{e}.{proj}": {"quant_algo": "NVFP4", "group_size": 16}
              for i in sorted(nvfp4_layers) for e in range(N_EXPERTS) for proj in PROJ}
    return {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers}


def bf16_rule(layers: set[int]) -> str:
    alt = "|".join(map(str, sorted(layers)))
    return f"precision.rules=[{{targets:['re:^model\\.layers\\.({alt})\\.mlp\\.experts\\.'],scheme:bf16}}]"


def findings(ckpt, *overrides) -> DoctorReport:
    cfg = compose_config("recipe=tiny_cpu", f"model.path={ckpt}", *overrides, f"run_dir={ckpt.parent / 'run'}")
    report = DoctorReport(str(ckpt))
    check_plan_agreement(plan_for_config(cfg), ckpt, report)
    print(report.table())
    return report


@pytest.fixture
def layers() -> set[int]:
    rng = random.Random(18)
    return set(rng.sample(range(1, N_LAYERS), 2))   # MoE layers whose experts stay BF16


@pytest.mark.parametrize("form", ["ignore", "mixed"])
def test_agreeing_checkpoint_config_and_plan_report_nothing(tmp_path, layers, form):
    qcfg = modelopt_ignore(layers) if form == "ignore" else modelopt_mixed(set(range(1, N_LAYERS)) - layers)
    write_checkpoint(tmp_path / "ckpt", layers, qcfg, seed=1)
    assert findings(tmp_path / "ckpt", bf16_rule(layers)).findings == []


def test_plan_that_differs_from_the_checkpoint_is_an_error_naming_the_layers_and_the_rule(tmp_path, layers):
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, layers, modelopt_ignore(layers), seed=2)
    report = findings(ckpt)   # the recipe serves every expert layer NVFP4
    assert [(f.check, f.severity) for f in report.findings] == [("plan", "error")]
    f = report.findings[0]
    assert f"layers {', '.join(map(str, sorted(layers)))}" in f.where and "routed_experts" in f.where
    assert "says bf16" in f.found and f.expected.startswith("nvfp4")
    # the fix names a rule; applying it makes checkpoint and plan agree
    rule = re.search(r"\((precision\.rules=\[.*\])\) or re-quantize", f.fix).group(1)
    assert findings(ckpt, rule).findings == []


def test_config_that_differs_from_the_tensors_is_an_error(tmp_path, layers):
    ckpt = tmp_path / "ckpt"
    forgotten = min(layers)   # BF16 tensors, but the export's ignore list does not name the layer
    write_checkpoint(ckpt, layers, modelopt_ignore(layers - {forgotten}), seed=3)
    report = findings(ckpt, bf16_rule(layers))
    assert [(f.check, f.where.split(" (")[0]) for f in report.findings] == \
        [("quant_config", f"routed_experts in layers {forgotten}")]
    assert "says nvfp4, the tensors are bf16" in report.findings[0].found


def test_unquantized_checkpoint_is_left_to_the_conversion_warning(tmp_path):
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, set(range(1, N_LAYERS)), None, seed=4)
    assert modelopt_quant_config(ckpt) is None
    assert findings(ckpt).findings == []


def test_claimed_scheme_follows_vllm_matching():
    q = {"quant_algo": "NVFP4", "exclude": ["model.layers.1*", "lm_head"], "quantized_layers": {}}
    assert claimed_scheme(q, "model.layers.1.mlp.experts.0.up_proj") is Scheme.BF16
    assert claimed_scheme(q, "model.layers.11.mlp.experts.0.up_proj") is Scheme.BF16   # vLLM's wildcard too
    assert claimed_scheme(q, "model.layers.2.mlp.experts.0.up_proj") is Scheme.NVFP4
    mixed = {"quant_algo": "MIXED_PRECISION", "exclude": [],
             "quantized_layers": {"model.layers.2.mlp.experts.0.up_proj": {"quant_algo": "NVFP4"},
                                  "model.layers.3.self_attn.o_proj": {"quant_algo": "FP8_PB_WO"}}}
    assert claimed_scheme(mixed, "model.layers.2.mlp.experts.1.down_proj") is Scheme.NVFP4  # one FusedMoE
    assert claimed_scheme(mixed, "model.layers.3.self_attn.o_proj") is Scheme.FP8_BLOCK
    assert claimed_scheme(mixed, "model.layers.3.self_attn.q_a_proj") is Scheme.BF16


def test_doctor_task_exits_1_on_a_plan_disagreement(tmp_path, layers):
    from nvfp4stack.tasks import doctor

    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, layers, modelopt_ignore(layers), seed=5)
    cfg = compose_config("recipe=tiny_cpu", f"checkpoint={ckpt}", f"run_dir={tmp_path / 'run'}")
    assert doctor.run(cfg) == 1
    errors = json.loads((tmp_path / "run" / "doctor.json").read_text())["errors"]
    assert [e["check"] for e in errors] == ["plan"]
    cfg = compose_config("recipe=tiny_cpu", f"checkpoint={ckpt}", bf16_rule(layers), f"run_dir={tmp_path / 'run2'}")
    assert doctor.run(cfg) == 0


def test_nvfp4_tensors_without_quantization_config_are_an_error(tmp_path):
    """What a data-free convert of the default recipe writes: NVFP4 experts, no quantization_config;
    the doctor must not call it clean when the plan serves NVFP4 experts (serve refuses it)."""
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, set(), None, seed=5)   # every MoE layer's experts NVFP4
    report = findings(ckpt)
    (f,) = report.errors
    assert (f.check, f.where, f.found) == ("quant_config", "config.json:quantization_config", "absent")
    assert "NVFP4 routed_experts" in f.expected and "quantize" in f.fix and report.exit_code == 1
    # the same tensors under a BF16 plan ask for nothing
    assert findings(ckpt, "precision=bf16").errors == []
