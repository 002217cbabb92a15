"""The doctor reports clean on the tiny DeepSeek-V4 checkpoints, and exactly the planted fault on copies.

vLLM's load check is off here (tests/engine/test_dsv4_load_check.py and tests/tasks/test_doctor.py
run it); every other check runs on real data of the tiny model in its layouts.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import INDEX_NAME, ShardedReader, save_sharded
from nvfp4stack.doctor import diagnose
from tests.support.doctor_faults import (
    copy_with_edit,
    edit_config,
    remove_tensor,
    rename_tensor,
    replace_tensor,
    tiny_dsv4_layouts,
    vllm_ready_config,
)

EXPERT = "layers.1.ffn.experts.3.w1"


def _cache() -> Path:
    return Path(os.environ.get("NVFP4STACK_TEST_CACHE", "~/.cache/nvfp4stack/test")).expanduser()


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    raw = tiny_dsv4_layouts(_cache())
    out = tmp_path_factory.mktemp("served")
    ready = {k: vllm_ready_config(v, out / k) for k, v in raw.items() if k != "hf"}
    return {"raw": raw, **ready}


@pytest.fixture
def seed() -> int:
    s = int(os.environ.get("NVFP4STACK_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"\n[seed] {s}  (replay: NVFP4STACK_SEED={s})")
    return s


def _doc(path) -> "object":
    r = diagnose(path, vllm="off")
    print(r.table())
    return r


def _errors(r) -> set[tuple[str, str]]:
    return {(f.check, f.where) for f in r.errors}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["bf16", "release", "modelopt", "cast"])
def test_clean_on_every_produced_layout(layouts, layout):
    if layout not in layouts["raw"]:
        pytest.skip(f"layout {layout!r} not produced yet (its converters are not registered)")
    r = _doc(layouts["raw"][layout])  # as produced, config.json untouched
    assert r.errors == [] and r.warnings == [], r.table()
    assert r.stats["missing_tensors"] == 0 and r.stats["tensors"] > 300


def test_transformers_layout_is_not_servable(layouts):
    r = _doc(layouts["raw"]["hf"])
    assert {f.check for f in r.errors} == {"layout"}


def test_missing_scale(layouts, tmp_path):
    r = _doc(remove_tensor(layouts["modelopt"], tmp_path / "c", f"{EXPERT}.weight_scale"))
    assert _errors(r) == {("missing", f"{EXPERT}.weight_scale")}
    want = list(ShardedReader(layouts["modelopt"]).infos[f"{EXPERT}.weight_scale"].shape)
    assert r.errors[0].expected == f"F8_E4M3 {want} (nvfp4 group)"


def test_renamed_scale_is_missing_plus_extra(layouts, tmp_path):
    r = _doc(rename_tensor(layouts["modelopt"], tmp_path / "c", f"{EXPERT}.weight_scale", f"{EXPERT}.wscale"))
    assert _errors(r) == {("missing", f"{EXPERT}.weight_scale"), ("extra", f"{EXPERT}.wscale")}


def test_unknown_parameter_reported(layouts, tmp_path, seed):
    g = torch.Generator().manual_seed(seed)

    def add(n, t):
        return [(n, t), ("layers.0.attn.position_bias", torch.randn(4, 8, generator=g))]

    r = _doc(copy_with_edit(layouts["release"], tmp_path / "c", add, only={"layers.0.attn_norm.weight"}))
    assert _errors(r) == {("extra", "layers.0.attn.position_bias")}


def test_shape_mismatch(layouts, tmp_path):
    r = _doc(replace_tensor(layouts["release"], tmp_path / "c", "layers.2.attn.q_norm.weight", lambda t: t[:-16]))
    assert _errors(r) == {("shape", "layers.2.attn.q_norm.weight")}


def test_wrong_scale_dtype(layouts, tmp_path):
    r = _doc(replace_tensor(layouts["modelopt"], tmp_path / "c", f"{EXPERT}.weight_scale", lambda t: t.float()))
    assert _errors(r) == {("dtype", f"{EXPERT}.weight_scale")}
    assert "scale dtype" in r.errors[0].fix


def test_ue8m0_bytes_declared_ue4m3(layouts, tmp_path, seed):
    """UE8M0 exponents (a few bytes near 127) written into an e4m3 weight_scale."""
    g = torch.Generator().manual_seed(seed)
    fake = lambda t: torch.randint(118, 128, t.shape, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)  # noqa: E731
    r = _doc(replace_tensor(layouts["modelopt"], tmp_path / "c", f"{EXPERT}.weight_scale", fake))
    assert _errors(r) == {("scale_format", f"{EXPERT}.weight_scale")}
    assert "UE8M0-like" in r.errors[0].found


def test_ue4m3_bytes_declared_ue8m0(layouts, tmp_path):
    """NVFP4 (e4m3) block-scale bytes stored as an MXFP4 expert's UE8M0 .scale."""
    src = ShardedReader(layouts["modelopt"]).get(f"{EXPERT}.weight_scale")  # [I, H/16] e4m3
    fake = lambda t: src.view(torch.uint8)[:, : t.shape[1]].contiguous().view(torch.float8_e8m0fnu)  # noqa: E731
    r = _doc(replace_tensor(layouts["release"], tmp_path / "c", f"{EXPERT}.scale", fake))
    assert _errors(r) == {("scale_format", f"{EXPERT}.scale")}
    assert "UE4M3-like" in r.errors[0].found


def test_block_scales_saturated(layouts, tmp_path, seed):
    g = torch.Generator().manual_seed(seed)

    def saturate(t):
        b = t.view(torch.uint8).clone()
        b[torch.rand(b.shape, generator=g) < 0.2] = 0x7E  # 448
        return b.view(torch.float8_e4m3fn)

    r = _doc(replace_tensor(layouts["modelopt"], tmp_path / "c", f"{EXPERT}.weight_scale", saturate))
    assert _errors(r) == {("scale_saturated", f"{EXPERT}.weight_scale")}


def test_block_scales_all_equal(layouts, tmp_path):
    r = _doc(replace_tensor(layouts["modelopt"], tmp_path / "c", f"{EXPERT}.weight_scale",
                            lambda t: torch.full(t.shape, 1.0).to(torch.float8_e4m3fn)))
    assert _errors(r) == {("scale_equal", f"{EXPERT}.weight_scale")}


@pytest.mark.parametrize("value, suffix", [(0.0, "weight_scale_2"), (float("nan"), "input_scale"),
                                           (float("inf"), "weight_scale_2"), (-1.0, "input_scale")])
def test_bad_global_scale(layouts, tmp_path, value, suffix):
    r = _doc(replace_tensor(layouts["modelopt"], tmp_path / "c", f"layers.2.ffn.experts.7.w2.{suffix}",
                            lambda t: torch.full_like(t, value)))
    assert _errors(r) == {("global_scale", f"layers.2.ffn.experts.7.w2.{suffix}")}


def test_w1_w3_global_scales_differ(layouts, tmp_path):
    r = _doc(replace_tensor(layouts["modelopt"], tmp_path / "c", "layers.3.ffn.experts.0.w3.weight_scale_2",
                            lambda t: t * 1.5))
    assert r.errors == []
    assert [(f.check, f.where) for f in r.warnings] == [("w13_global", "layers.3.ffn.experts.0.w1.weight_scale_2")]
    assert "w13_weight_scale_2[:, 0]" in r.warnings[0].fix


@pytest.mark.parametrize("name", ["layers.1.ffn.gate.weight", "layers.2.attn.wq_b.weight", "hc_head_fn"])
def test_nan_inf_in_weights(layouts, tmp_path, seed, name):
    g = torch.Generator().manual_seed(seed)

    def poison(t):
        f = t.float().clone().reshape(-1)
        idx = torch.randint(0, f.numel(), (3,), generator=g)
        f[idx] = torch.tensor([float("nan"), float("inf"), -float("inf")])
        return f.reshape(t.shape).to(t.dtype)

    r = _doc(replace_tensor(layouts["release"], tmp_path / "c", name, poison))
    assert _errors(r) == {("nan_inf", name)}


@pytest.fixture(scope="module")
def sharded(layouts, tmp_path_factory) -> Path:
    """The release layout re-written as several shards with an index (the faults below need one)."""
    src = layouts["release"]
    out = tmp_path_factory.mktemp("sharded") / "ckpt"
    r = ShardedReader(src)
    save_sharded(((n, r.get(n)) for n in r.names()), out, max_shard_bytes=4 << 20)
    edit_config(src, out.with_name("cfg"), lambda c: c)  # config + tokenizer files
    for p in out.with_name("cfg").iterdir():
        if p.suffix != ".safetensors" and not (out / p.name).exists():
            (out / p.name).write_bytes(p.read_bytes())
    assert len(list(out.glob("*.safetensors"))) >= 3
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_sharded_copy_is_clean(sharded):
    assert _doc(sharded).errors == []


def test_missing_shard_referenced_by_index(sharded, tmp_path):
    c = _copy(sharded, tmp_path / "c")
    gone = sorted(c.glob("*.safetensors"))[1]
    gone.unlink()
    r = _doc(c)
    assert ("index", gone.name) in _errors(r)
    # the tensors of the lost shard are also reported missing, by name
    assert {chk for chk, _ in _errors(r)} <= {"index", "missing"}


def test_truncated_shard(sharded, tmp_path):
    c = _copy(sharded, tmp_path / "c")
    shard = sorted(c.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 1000])
    r = _doc(c)
    assert any(chk == "truncated" and w.startswith(shard.name) for chk, w in _errors(r)), r.table()
    assert {chk for chk, _ in _errors(r)} <= {"truncated", "missing", "index"}


def test_corrupted_header(sharded, tmp_path):
    c = _copy(sharded, tmp_path / "c")
    shard = sorted(c.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[8:12] = b"\x00\xff{["  # garbage at the start of the JSON header
    shard.write_bytes(bytes(data))
    r = _doc(c)
    assert ("header", shard.name) in _errors(r)


def test_index_lists_tensor_absent_from_shard(sharded, tmp_path):
    c = _copy(sharded, tmp_path / "c")
    idx = json.loads((c / INDEX_NAME).read_text())
    first = sorted(c.glob("*.safetensors"))[0].name
    idx["weight_map"]["layers.0.attn.ghost.weight"] = first
    (c / INDEX_NAME).write_text(json.dumps(idx))
    assert _errors(_doc(c)) == {("index", "layers.0.attn.ghost.weight")}


@pytest.mark.parametrize("key, edit", [
    ("topk_method", lambda c: {k: v for k, v in c.items() if k != "topk_method"}),
    ("compress_ratios", lambda c: {k: v for k, v in c.items() if k != "compress_ratios"} | {"layer_types": c["layer_types"]}),
    ("num_hash_layers", lambda c: {k: v for k, v in c.items() if k != "num_hash_layers"}),
    # transformers' names: vLLM's config parsing (validate_layer_type) rejects them
    ("mlp_layer_types", lambda c: c | {"mlp_layer_types": ["hash_moe"] + ["moe"] * (c["num_hidden_layers"] - 1)}),
    ("expert_dtype", lambda c: c | {"expert_dtype": "fp8"}),
    ("quantization_config.moe_quant_algo",
     lambda c: c | {"quantization_config": {k: v for k, v in c["quantization_config"].items() if k != "moe_quant_algo"}}),
    ("quantization_config.scale_fmt",
     lambda c: c | {"quantization_config": {k: v for k, v in c["quantization_config"].items() if k != "scale_fmt"}}),
])
def test_config_field_vllm_needs(layouts, tmp_path, key, edit):
    r = _doc(edit_config(layouts["modelopt"], tmp_path / "c", edit))
    assert ("config", f"config.json:{key}") in _errors(r)
    assert {chk for chk, _ in _errors(r)} == {"config"}, r.table()


def test_doctor_writes_nothing(layouts):
    before = {p.name: p.stat().st_mtime_ns for p in layouts["modelopt"].iterdir()}
    _doc(layouts["modelopt"])
    assert {p.name: p.stat().st_mtime_ns for p in layouts["modelopt"].iterdir()} == before


def _table_rows(r) -> list[str]:
    return [ln for ln in r.table().splitlines() if ln.startswith("  ") and "|" in ln]


def test_truncated_shard_is_one_root_row_with_its_follow_ons_counted(sharded, tmp_path):
    c = _copy(sharded, tmp_path / "c")
    shard = sorted(c.glob("*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    r = _doc(c)
    roots = [f for f in r.errors if not f.cause]
    assert [(f.check, f.where) for f in roots] == [("truncated", shard.name)], r.table()
    assert "tensors lie past the end" in roots[0].found and "re-copy" in roots[0].fix
    follow = [f for f in r.errors if f.cause]
    assert len(follow) > 50 and {f.cause for f in follow} == {shard.name}
    assert {f.check for f in follow} <= {"missing", "index", "extra", "format"}
    rows = _table_rows(r)
    assert len(rows) == 3, r.table()   # the column header, the root, one row counting its follow-ons
    assert rows[2].startswith("  follow-on") and f"{len(follow)} follow-on errors of {shard.name}" in rows[2]
    assert r.skipped["vllm_load"].startswith("turned off")


def test_missing_shard_is_one_root_row(sharded, tmp_path):
    c = _copy(sharded, tmp_path / "c")
    gone = sorted(c.glob("*.safetensors"))[2]
    gone.unlink()
    r = _doc(c)
    assert [(f.check, f.where) for f in r.errors if not f.cause] == [("index", gone.name)], r.table()
    assert len(_table_rows(r)) == 3 and r.exit_code == 1


def _served(layouts, scheme: str):
    """A stand-in plan: every routed expert of the checkpoint served as ``scheme``."""
    from types import SimpleNamespace

    from nvfp4stack.plan.groups import group_name
    from nvfp4stack.schemes import Scheme

    names = {group_name(n)[0] for n in ShardedReader(layouts["modelopt"]).names() if ".ffn.experts." in n}
    return SimpleNamespace(groups=[SimpleNamespace(name=g, served=Scheme(scheme), converter=None) for g in names])


@pytest.fixture(scope="module")
def no_input_scales(layouts, tmp_path_factory) -> Path:
    """The modelopt layout as a data-free convert writes it: NVFP4 experts without input_scale."""
    return copy_with_edit(layouts["modelopt"], tmp_path_factory.mktemp("w4a16") / "c",
                          lambda n, t: [] if n.endswith(".input_scale") else [(n, t)])


def test_weight_only_experts_need_no_input_scale(layouts, no_input_scales):
    r = diagnose(no_input_scales, vllm="off", plan=_served(layouts, "nvfp4_w4a16"))
    assert r.errors == [], r.table()
    (note,) = [n for n in r.notes if "input_scale" in n]
    assert note.startswith("192 input_scale tensor(s) absent") and "weight-only (nvfp4_w4a16)" in note


def test_w4a4_experts_without_input_scale_name_quantize(layouts, no_input_scales):
    r = diagnose(no_input_scales, vllm="off", plan=_served(layouts, "nvfp4"))
    assert {(f.check, f.where.rsplit(".", 1)[-1]) for f in r.errors} == {("missing", "input_scale")}
    assert len(r.errors) == 192
    assert "quantize" in r.errors[0].fix and "precision.routed_experts=nvfp4_w4a16" in r.errors[0].fix
    rows = _table_rows(r)
    assert len(rows) == 2 and "(x192)" in rows[1], r.table()   # header + one counted row
