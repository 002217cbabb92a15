"""Proof by change (#37): a storage format added from outside the package (tests/support/toy_codec.py,
its codec, scheme, converter and kernel in one file) goes through plan, convert, doctor, the quantize
report, the memory plan and eval's emulation with no other change."""
import json
import warnings

import pytest
import torch
from safetensors.torch import save_file

from nvfp4stack.arch import resolve
from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.config import BackendConfig, PrecisionConfig
from nvfp4stack.convert.base import CONVERTERS
from nvfp4stack.convert.stream import convert_checkpoint
from nvfp4stack.doctor import diagnose
from nvfp4stack.doctor.files import by_group, read_checkpoint, sniff
from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.eval.emulate import emulate_weight
from nvfp4stack.families.registry import get_family
from nvfp4stack.formats.codec import CODECS
from nvfp4stack.plan.groups import groups_from_checkpoint
from nvfp4stack.plan.memory import Layout
from nvfp4stack.plan.planner import build_plan
from nvfp4stack.quantize.report import dequantize_group, weight_errors
from nvfp4stack.schemes import Scheme
from nvfp4stack.tasks.convert import chooser_from_plan
from tests.support.toy_codec import CONVERTER, KERNEL, NAME, register_toy_codec
from tests.support.toy_family import register_toy_family

MLP = [f"model.layers.0.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]


@pytest.fixture
def toy(monkeypatch):
    register_toy_family(monkeypatch)
    return register_toy_codec(monkeypatch)


@pytest.fixture
def bf16_ckpt(tmp_path, seed, make_weights):
    gen = torch.Generator().manual_seed(seed)
    t = {f"{MLP[0]}.weight": make_weights("normal", (96, 64), gen), f"{MLP[1]}.weight": make_weights("student_t", (96, 64), gen),
         f"{MLP[2]}.weight": make_weights("outliers", (64, 96), gen),
         "model.layers.0.input_layernorm.weight": make_weights("normal", (64,), gen),
         "model.embed_tokens.weight": make_weights("normal", (50, 64), gen)}
    src = tmp_path / "src"
    src.mkdir()
    save_file(t, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"architectures": ["ToyForCausalLM"], "num_hidden_layers": 1}))
    return src


def _plan(ckpt, source_format):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the default precision names roles the toy family lacks
        family = get_family("toy")
        return build_plan(groups_from_checkpoint(ckpt, 1, family), model="toy", family=family, arch=resolve("cpu"),
                          source_format=source_format, precision=PrecisionConfig(dense_mlp=NAME),
                          backend=BackendConfig(linear=KERNEL), layout=Layout())


def test_toy_format_through_plan_convert_doctor_report(toy, bf16_ckpt, tmp_path):
    plan = _plan(bf16_ckpt, "bf16")   # the config value names the toy scheme like any other
    mlp = {g.name: g for g in plan.groups if g.name in MLP}
    assert {(g.source, g.target, g.converter, g.kernel) for g in mlp.values()} == {(Scheme.BF16, toy, CONVERTER, KERNEL)}
    # memory plan: the toy codec counts int8 weights + one bf16 scale per row
    assert mlp[MLP[0]].bytes == 96 * 64 + 2 * 96 and mlp[MLP[2]].bytes == 64 * 96 + 2 * 64

    dst = tmp_path / "out"
    convert_checkpoint(bf16_ckpt, dst, chooser_from_plan(plan), sources={g.name: g.source for g in plan.groups},
                       device="cpu", progress=False)
    out = ShardedReader(dst)
    for g in MLP:   # the plan's bytes are the converted bytes
        assert out.infos[f"{g}.weight"].dtype == "I8"
        assert out.infos[f"{g}.weight"].nbytes + out.infos[f"{g}.row_scale"].nbytes == mlp[g].bytes

    stored = by_group(read_checkpoint(dst, DoctorReport(str(dst))))
    assert {g: sniff(stored[g]) for g in MLP} == dict.fromkeys(MLP, toy)

    again = _plan(dst, NAME)   # planned from the converted checkpoint: detected, kept, same bytes
    kept = {g.name: g for g in again.groups if g.name in MLP}
    assert {(g.source, g.target, g.converter) for g in kept.values()} == {(toy, toy, None)}
    assert {g: kept[g].bytes for g in MLP} == {g: mlp[g].bytes for g in MLP}
    assert again.total_bytes == plan.total_bytes

    report = diagnose(dst, vllm="off", plan=again)
    assert report.exit_code == 0, report.table()
    assert not report.errors and not report.warnings
    pending = diagnose(dst, vllm="off", plan=plan)   # a plan that still converts bf16 -> toy_int8: warned
    assert {f.check for f in pending.warnings} == {"plan"} and pending.exit_code == 0

    src = ShardedReader(bf16_ckpt)
    errors = weight_errors(out, src, family=get_family("toy"))
    assert errors["dense_mlp"]["formats"] == [NAME] and errors["dense_mlp"]["tensors"] == 3
    assert 0 < errors["dense_mlp"]["rel_error"] < 0.02
    w = src.get(f"{MLP[1]}.weight").float()   # eval's emulation is the converter's round trip
    assert torch.equal(dequantize_group(out, f"{MLP[1]}.weight"), emulate_weight(w, toy, MLP[1]))


def test_registration_ends_with_the_test(bf16_ckpt):
    with pytest.MonkeyPatch.context() as mp:
        toy = register_toy_codec(mp)
        assert Scheme(NAME) is toy and NAME in CODECS and CONVERTER in CONVERTERS
    assert NAME not in Scheme.names() and NAME not in CODECS and CONVERTER not in CONVERTERS
    with pytest.raises(ValueError, match=rf"precision.dense_mlp.*{NAME}"):
        PrecisionConfig(dense_mlp=NAME)
