"""Storage codecs: bytes match what the quantizers write, one detection for planner / doctor /
report (the cases where the three used to disagree), dequantize and emulation through the codec."""
import math

import pytest
import torch
from safetensors.torch import save_file

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.doctor.files import by_group, read_checkpoint, sniff
from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.eval.emulate import emulate_weight
from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.formats.codec import CODECS, Entry, detect, group_suffixes, load_codecs
from nvfp4stack.formats.fp8_block import dequantize_fp8_block, quantize_fp8_block
from nvfp4stack.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from nvfp4stack.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4
from nvfp4stack.plan.groups import group_name, sniff_scheme
from nvfp4stack.plan.memory import group_bytes
from nvfp4stack.plan.planner import PlanError, converter_for
from nvfp4stack.quantize.report import dequantize_group, stored_format
from nvfp4stack.schemes import Scheme


def _matrix(shape, dtype="bf16"):
    return TensorGroup("m", tuple(shape), "dense_mlp", False, dtype, True)


def test_every_scheme_has_a_codec_and_nvfp4_schemes_share_one():
    load_codecs()
    assert {s.storage for s in Scheme} <= set(CODECS.names())
    assert Scheme.NVFP4.storage == Scheme.NVFP4_W4A16.storage == "nvfp4"
    assert (Scheme.NVFP4.activation, Scheme.NVFP4_W4A16.activation, Scheme.FP8_BLOCK.activation) == ("fp4", "bf16", "fp8")
    assert Scheme.NVFP4.codec is Scheme.NVFP4_W4A16.codec is CODECS.get("nvfp4")


@pytest.mark.parametrize("shape", [(256, 512), (3, 64, 160)])
def test_nvfp4_bytes_are_what_quantize_writes(seed, make_weights, shape):
    q = quantize_nvfp4(make_weights("student_t", shape, torch.Generator().manual_seed(seed)))
    e = shape[0] if len(shape) == 3 else 1
    written = q.data.numel() + q.scale.numel() + 4 * e + 4 * e   # + weight_scale_2 and input_scale per matrix
    assert group_bytes(_matrix(shape), Scheme.NVFP4) == group_bytes(_matrix(shape), Scheme.NVFP4_W4A16) == written


def test_mxfp4_and_fp8_bytes_are_what_quantize_writes(seed, make_weights):
    gen = torch.Generator().manual_seed(seed)
    assert group_bytes(_matrix((96, 256)), Scheme.MXFP4) == quantize_mxfp4(make_weights("normal", (96, 256), gen)).nbytes
    w = make_weights("outliers", (200, 300), gen)   # not whole 128-blocks: the scale grid rounds up
    assert group_bytes(_matrix(w.shape), Scheme.FP8_BLOCK) == quantize_fp8_block(w, ue8m0=True).nbytes == 200 * 300 + 2 * 3
    assert group_bytes(_matrix(w.shape), Scheme.FP8_BLOCK, fp8_ue8m0=False) == quantize_fp8_block(w, ue8m0=False).nbytes


def test_unquantized_bytes():
    assert group_bytes(_matrix((8, 16), "f32"), Scheme.BF16) == 8 * 16 * 2
    assert group_bytes(_matrix((8, 16), "f32"), Scheme.PASSTHROUGH) == 8 * 16 * 4
    norm = TensorGroup("n", (16,), "unknown", False, "f32", False)
    assert group_bytes(norm, Scheme.NVFP4) == 16 * 4   # not a matrix: kept as stored


def test_bits_per_weight_from_codecs():
    assert (Scheme.NVFP4.bits_per_weight, Scheme.MXFP4.bits_per_weight) == (4.5, 4.25)
    assert math.isclose(Scheme.FP8_BLOCK.bits_per_weight, 8 + 32 / 128 ** 2)


U8, I8, F8, BF, F32, E8 = (Entry(d, (4, 4)) for d in ("U8", "I8", "F8_E4M3", "BF16", "F32", "F8_E8M0"))


@pytest.mark.parametrize("entries, want", [
    ({"weight": U8, "weight_scale": Entry("F8_E4M3", (4, 1)), "weight_scale_2": F32}, Scheme.NVFP4),
    ({"weight_scale_2": F32, "weight_scale": F8}, Scheme.NVFP4),   # weight lost: the global scale still tells
    ({"weight": U8, "scale": E8}, Scheme.MXFP4),
    ({"weight": I8, "scales": E8}, Scheme.MXFP4),                  # was undecided to the doctor
    ({"weight": F8, "weight_scale_inv": F32}, Scheme.FP8_BLOCK),
    ({"weight": F8, "weight_scale": F32, "input_scale": F32}, Scheme.FP8_BLOCK),  # FP8 per tensor is no NVFP4
    ({"weight": BF}, Scheme.BF16),
    ({"weight": U8}, None),                                        # packed E2M1, no scale: cannot tell
    ({"weight": Entry("I64", (4,))}, None),
])
def test_one_detection(entries, want):
    assert Scheme.detect(entries) is want
    assert sniff_scheme({k: {"dtype": e.dtype, "shape": e.shape} for k, e in entries.items()}) is (want or Scheme.PASSTHROUGH)
    assert (detect(entries) is None) == (want is None)


def test_group_suffixes_cover_every_layout():
    assert {"weight", "weight_scale", "weight_scale_2", "input_scale", "scale", "scales", "weight_scale_inv"} \
        == set(group_suffixes())
    assert group_name("layers.0.ffn.experts.3.w1.weight_scale_2") == ("layers.0.ffn.experts.3.w1", "weight_scale_2")
    assert group_name("layers.0.attn.attn_sink") == ("layers.0.attn.attn_sink", "")


@pytest.fixture
def mixed_ckpt(tmp_path, seed, make_weights):
    """One group per format, in the spellings the three detectors used to disagree on."""
    gen = torch.Generator().manual_seed(seed)
    w = {k: make_weights(k, (128, 256), gen) for k in ("normal", "student_t", "outliers")}
    nv, mx, f8 = quantize_nvfp4(w["normal"]), quantize_mxfp4(w["student_t"]), quantize_fp8_block(w["outliers"])
    t = {"nv.weight": nv.data, "nv.weight_scale": nv.scale, "nv.weight_scale_2": nv.global_scale,
         "nv.input_scale": torch.tensor(0.5),
         "mx.weight": mx.data.view(torch.int8), "mx.scales": mx.scale.view(torch.float8_e8m0fnu),
         "f8.weight": f8.data, "f8.weight_scale_inv": f8.scale.view(torch.float8_e8m0fnu),
         "packed.weight": nv.data.clone(), "bf.weight": w["normal"], "f32.weight": w["normal"].float()}
    save_file(t, str(tmp_path / "model.safetensors"))
    return tmp_path, (nv, mx, f8)


def test_planner_doctor_and_report_agree(mixed_ckpt):
    ckpt, _ = mixed_ckpt
    stored = by_group(read_checkpoint(ckpt, DoctorReport(str(ckpt))))
    reader = ShardedReader(ckpt)
    want = {"nv": "nvfp4", "mx": "mxfp4", "f8": "fp8_block", "bf": "bf16", "f32": "f32", "packed": "u8"}
    for g, fmt in want.items():
        doctor = sniff(stored[g])
        planner = sniff_scheme({s: {"dtype": i.dtype, "shape": i.shape} for s, i in stored[g].items()})
        assert stored_format(reader, f"{g}.weight") == fmt, g
        if g == "packed":
            assert (doctor, planner) == (None, Scheme.PASSTHROUGH)
        else:
            assert doctor is planner and planner.storage == ("bf16" if g == "f32" else fmt), g


def test_report_dequantizes_through_the_codec(mixed_ckpt):
    ckpt, (nv, mx, f8) = mixed_ckpt
    reader = ShardedReader(ckpt)
    assert torch.equal(dequantize_group(reader, "nv.weight"),
                       dequantize_nvfp4(nv.data, nv.scale, nv.global_scale, torch.float32))
    assert torch.equal(dequantize_group(reader, "mx.weight"), dequantize_mxfp4(mx.data, mx.scale, torch.float32))
    # the HF spelling of the FP8 scale was read as a bare f8 weight before
    assert torch.equal(dequantize_group(reader, "f8.weight"), dequantize_fp8_block(f8.data, f8.scale, torch.float32))
    assert torch.equal(dequantize_group(reader, "f32.weight"), reader.get("f32.weight"))


def test_report_names_the_missing_tensor(tmp_path):
    save_file({"g.weight": torch.zeros(4, 8, dtype=torch.uint8), "g.weight_scale_2": torch.tensor(1.0)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match=r"g: NVFP4 group needs g.weight_scale"):
        dequantize_group(ShardedReader(tmp_path), "g.weight")


def test_emulation_is_the_codecs_round_trip(seed, make_weights):
    w = make_weights("outliers", (64, 256), torch.Generator().manual_seed(seed))
    assert torch.equal(emulate_weight(w, Scheme.NVFP4_W4A16, "w"), quantize_nvfp4(w).dequantize(torch.float32).to(w.dtype))
    assert torch.equal(emulate_weight(w, Scheme.MXFP4, "w"), quantize_mxfp4(w).dequantize(torch.float32).to(w.dtype))
    assert torch.equal(emulate_weight(w, Scheme.FP8_BLOCK, "w"),
                       quantize_fp8_block(w, ue8m0=True).dequantize(torch.float32).to(w.dtype))
    assert emulate_weight(w.float(), Scheme.PASSTHROUGH, "w").dtype == torch.float32
    assert torch.equal(emulate_weight(w.float(), Scheme.BF16, "w"), w.float())


def test_converters_are_found_by_storage():
    assert converter_for(Scheme.NVFP4, Scheme.NVFP4_W4A16, "g") is None   # same bytes, other activations
    assert converter_for(Scheme.NVFP4_W4A16, Scheme.BF16, "g") == "nvfp4_to_bf16"
    assert converter_for(Scheme.BF16, Scheme.NVFP4_W4A16, "g") == "bf16_to_nvfp4"
    with pytest.raises(PlanError, match=r"^g: no converter from fp8_block to mxfp4; available: "):
        converter_for(Scheme.FP8_BLOCK, Scheme.MXFP4, "g")


def test_scheme_registry_refuses_a_second_definition():
    assert Scheme.register("nvfp4", storage="nvfp4", activation="fp4") is Scheme.NVFP4
    with pytest.raises(ValueError, match=r"scheme 'nvfp4' is registered twice \(nvfp4 x fp4 and mxfp4 x bf16\)"):
        Scheme.register("nvfp4", storage="mxfp4", activation="bf16")
    with pytest.raises(ValueError, match=r"scheme 'x': activation 'fp16'; valid: bf16, fp8, fp4"):
        Scheme.register("x", storage="bf16", activation="fp16")
    assert "x" not in Scheme.names()
