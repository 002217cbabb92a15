"""Doctor, structure: the DeepSeek-V4 tensors a checkpoint must hold (names, shapes, dtypes).

Expected groups come from ``dsv4_tensor_groups(config)`` (the shapes vLLM's parameter creation
uses). Each group's stored format is sniffed from its own tensors; the format most groups of the
same role use decides what a group with missing tensors should have held, so a lost
``weight_scale`` is reported as exactly that and not as a change of format.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict

from nvfp4stack.checkpoint.safetensors_io import TensorInfo
from nvfp4stack.doctor.files import by_group, sniff
from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.models.deepseek_v4.spec import TensorGroup, dsv4_tensor_groups
from nvfp4stack.plan.groups import group_name
from nvfp4stack.schemes import Scheme

FP8_BLOCK = 128
_UE8M0 = {"F8_E8M0", "U8"}
_EXPERT_ID = re.compile(r"^layers\.\d+\.ffn\.experts\.(\d+)\.")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def expected_tensors(tg: TensorGroup, scheme: Scheme | None) -> dict[str, tuple[set[str], tuple]]:
    """suffix ('' for a bare name) -> (allowed safetensors dtypes, shape) of one group."""
    if not tg.is_matrix:
        dtypes = {"bf16": {"BF16"}, "f32": {"F32"}, "i64": {"I64", "I32"}}[tg.dtype]
        return {"weight" if tg.role == "norms" else "": (dtypes, tuple(tg.shape))}
    n, k = tg.shape
    if scheme is Scheme.NVFP4 or scheme is Scheme.NVFP4_W4A16:
        return {"weight": ({"U8"}, (n, k // 2)), "weight_scale": ({"F8_E4M3"}, (n, k // 16)),
                "weight_scale_2": ({"F32"}, ()), "input_scale": ({"F32"}, ())}
    if scheme is Scheme.MXFP4:
        return {"weight": ({"I8", "U8"}, (n, k // 2)), "scale": (_UE8M0, (n, k // 32))}
    if scheme is Scheme.FP8_BLOCK:
        return {"weight": ({"F8_E4M3"}, (n, k)),
                "scale": (_UE8M0 | {"F32"}, (_cdiv(n, FP8_BLOCK), _cdiv(k, FP8_BLOCK)))}
    return {"weight": ({"BF16"}, (n, k))}


def _from_config(sufs: dict[str, TensorInfo], config: dict) -> Scheme:
    """Last resort when no group of a role kept its scales: the weight dtype plus config.json."""
    w = sufs.get("weight")
    if w is not None and w.dtype in ("U8", "I8"):
        algo = ((config.get("quantization_config") or {}).get("moe_quant_algo") or "").upper()
        return Scheme.NVFP4 if algo == "NVFP4" else Scheme.MXFP4
    if w is not None and w.dtype.startswith("F8"):
        return Scheme.FP8_BLOCK
    return Scheme.BF16


def _missing_fix(suffix: str, served: str | None) -> str:
    if suffix == "input_scale" and served == Scheme.NVFP4.value:
        return ("the recipe's plan serves these experts W4A4 (nvfp4), which needs calibrated activation scales, "
                "and a data-free convert has none: run 'python main.py recipe=... quantize' (calibrates), or serve "
                "them weight-only (precision.routed_experts=nvfp4_w4a16)")
    return "re-export or re-convert the checkpoint; vLLM would leave this parameter unset"


def _stored_name(group: str, suffix: str) -> str:
    return f"{group}.{suffix}" if suffix else group


def check_expert_count(config: dict, tensors: dict[str, TensorInfo], report: DoctorReport) -> None:
    """config.json's n_routed_experts against the experts the shards hold: one root finding, before
    the missing or extra expert tensors that follow from it."""
    ids = {int(m.group(1)): name for name in tensors if (m := _EXPERT_ID.match(name))}
    n = config.get("n_routed_experts")
    if not ids or not isinstance(n, int) or max(ids) + 1 == n:
        return
    held, last = max(ids) + 1, ids[max(ids)]
    report.error("experts", "config.json:n_routed_experts", n,
                 f"{held}, the experts the shards hold (0..{held - 1}: {last} is in {tensors[last].file.name})",
                 f"set n_routed_experts: {held} in config.json, or use the config.json these shards came with")


def check_structure(config: dict, tensors: dict[str, TensorInfo], report: DoctorReport) -> dict[str, Scheme]:
    """Missing / extra tensors, shape and dtype mismatches. Returns group -> expected scheme."""
    check_expert_count(config, tensors, report)
    if "num_hash_layers" not in config and "mlp_layer_types" not in config:
        # the config check reports the missing key; the structure follows what the shards show
        hashed = {n.split(".")[1] for n in tensors if n.startswith("layers.") and n.endswith(".ffn.gate.tid2eid")}
        config = {**config, "num_hash_layers": len(hashed)}
    try:
        spec = {tg.name: tg for tg in dsv4_tensor_groups(config)}
    except (KeyError, ValueError) as e:
        report.error("config", "config.json", str(e).strip("'\""), "the DeepSeek-V4 fields dsv4_tensor_groups needs",
                     "add the missing field (see the config check below)")
        return {}
    present = by_group(tensors)
    votes: dict[tuple, Counter] = defaultdict(Counter)
    sniffed = {}
    for g, tg in spec.items():
        if tg.is_matrix and g in present:
            sniffed[g] = sniff(present[g])
            if sniffed[g] is not None:
                votes[(tg.role, tg.mtp)][sniffed[g]] += 1
    schemes: dict[str, Scheme] = {}
    n_missing = 0
    unused_input_scales: list[str] = []
    lost_in = {}   # group -> the broken shard that lost some of its tensors
    for n, cause in report.lost.items():
        lost_in.setdefault(group_name(n)[0], cause)
    for g, tg in spec.items():
        scheme = None
        if g in lost_in:  # with some of its tensors lost, its format and extras are guesses: follow-ons
            report.lose([g, *(_stored_name(g, suf) for suf in present.get(g, {}))], lost_in[g])
        if tg.is_matrix:
            # a role whose every group lost its scales (one lost shard) follows the same role outside/inside MTP
            majority = votes[(tg.role, tg.mtp)].most_common(1) or votes[(tg.role, not tg.mtp)].most_common(1)
            scheme = sniffed.get(g) or (majority[0][0] if majority else _from_config(present.get(g, {}), config))
            if majority and scheme is not majority[0][0]:
                report.error("format", g, f"stored as {scheme.value}",
                             f"{majority[0][0].value} like the other groups of role {tg.role}",
                             "re-export this group in its role's format (vLLM builds one "
                             "quant method per role)")
            schemes[g] = scheme
        have = present.get(g, {})
        for suf, (dtypes, shape) in expected_tensors(tg, scheme).items():
            name = _stored_name(g, suf)
            info = have.get(suf)
            if info is None:
                served = report.served.get(g)
                if suf == "input_scale" and served == Scheme.NVFP4_W4A16.value:
                    unused_input_scales.append(name)
                    continue
                n_missing += 1
                fmt = f" ({scheme.value} group)" if scheme else ""
                report.error("missing", name, "absent", f"{'/'.join(sorted(dtypes))} {list(shape)}{fmt}",
                             _missing_fix(suf, served))
                continue
            if info.dtype not in dtypes:
                what = "scale dtype" if "scale" in suf else "dtype"
                report.error("dtype", name, info.dtype, "/".join(sorted(dtypes)),
                             f"wrong {what}: store it as {'/'.join(sorted(dtypes))} (a numeric cast by vLLM's "
                             "loader would corrupt it)")
            if tuple(info.shape) != tuple(shape) and not (shape == () and tuple(info.shape) == (1,)):
                report.error("shape", name, list(info.shape), list(shape),
                             "re-export with the config.json this checkpoint is served with (or fix config.json)")
        for suf in sorted(set(have) - set(expected_tensors(tg, scheme))):
            report.error("extra", _stored_name(g, suf), f"{have[suf].dtype} {list(have[suf].shape)}",
                         f"no such tensor in a {scheme.value if scheme else 'plain'} group",
                         "remove it, or rename it to the suffix vLLM expects")
    for g in sorted(set(present) - set(spec)):
        for suf, info in sorted(present[g].items()):
            report.error("extra", _stored_name(g, suf), f"{info.dtype} {list(info.shape)}",
                         "a DeepSeek-V4 native tensor name (vLLM's loader raises KeyError on unknown names)",
                         "rename it to its native name or remove it; it is reported, never silently dropped")
    if unused_input_scales:
        report.note(f"{len(unused_input_scales)} input_scale tensor(s) absent (e.g. {unused_input_scales[0]}), as "
                    "expected: the recipe's plan serves these experts weight-only (nvfp4_w4a16); vLLM creates the "
                    "parameter, weight-only kernels never read it")
    report.stats["expected_groups"] = len(spec)
    report.stats["missing_tensors"] = n_missing
    return schemes
