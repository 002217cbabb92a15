"""The load check's record and verdict: what each of vLLM's ``weight_loader`` calls took from which
checkpoint tensor, and the errors, warnings and notes that record and the written boxes give (child side
of :mod:`.load_check`)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nvfp4stack.models.deepseek_v4.load_check import LoadReport

# MTP tensors: vLLM loads them into the separate DeepSeekV4MTP draft model (speculative decoding);
# the target model's mapper drops ``mtp.*`` (cpu/model.py: "No MTP support on CPU yet").
MTP_PREFIX = "mtp."
# Said in every finished report, so nobody reads "ok" as "vLLM can run this model here".
NOT_RUN_NOTE = ("not run: process_weights_after_loading and any forward (the kernels' weight repacking "
                "and GEMMs need the serving hardware; this check ends when the loaded weights are checked)")


def judge_load(report: LoadReport, recorder, calls: list[dict], seen_names: list[tuple[str, str, tuple]], mapper,
               params: dict, unused: list[str]) -> None:
    """Fill ``report`` from one finished load: every checkpoint tensor reached a parameter with a
    bit-preserving dtype pairing, and the written boxes cover every parameter not in ``unused``."""
    unwritten = {}
    for pname, cov in recorder.coverage.items():
        if cov.opaque:
            report.notes.append(f"vLLM parameter {pname}: written by {sorted(set(cov.opaque))}, whose written "
                                "elements cannot be told without values; its coverage is not checked")
        else:
            unwritten[pname] = cov.unwritten()
    by_tensor: dict[str, list[dict]] = {}
    by_param: dict[str, list[dict]] = {}
    for c in calls:
        by_tensor.setdefault(c["checkpoint"], []).append(c)
        by_param.setdefault(c["param"], []).append(c)
    for name, dtype, shape in seen_names:
        mapped = mapper._map_name(name)
        if mapped is None:
            report.dropped_by_mapper.append(name)
            if not name.startswith(MTP_PREFIX):
                report.errors.append(f"checkpoint tensor {name!r}: vLLM's hf_to_vllm_mapper drops it; "
                                     "rename it to a native DeepSeek-V4 name")
            continue
        landed = by_tensor.get(name, [])
        if not landed:
            # attn_sink is copied without a weight_loader (cpu/model.py); the recorded writes prove it landed
            if mapped in params and unwritten.get(mapped, (0,))[0] == 0 and recorder.coverage[mapped].boxes:
                report.n_loaded_tensors += 1
                continue
            report.errors.append(f"checkpoint tensor {name!r} ({dtype} {list(shape)}) reached no vLLM parameter "
                                 f"(vLLM name {mapped!r}); it is unknown to vLLM's DeepSeek-V4 and would be "
                                 "ignored. Fix: rename it or remove it")
            continue
        report.n_loaded_tensors += 1
        for c in landed:
            verdict = _dtype_pairing(_torch_dtype(c["src_dtype"]), _torch_dtype(c["dst_dtype"]))
            where = (f"checkpoint tensor {name!r} ({c['src_dtype']} {c['src_shape']}) -> vLLM parameter "
                     f"{c['param']} ({c['dst_dtype']} {c['dst_shape']})")
            if verdict == "bad":
                report.errors.append(f"{where}: dtype pairing converts the values numerically instead of "
                                     "keeping the bytes; expected the parameter's dtype. Fix: store the tensor "
                                     f"as {c['dst_dtype']}")
            elif verdict == "narrowing":
                report.warnings.append(f"{where}: values are rounded to the narrower parameter dtype")
            if c["shard_id"] is None and c["expert_id"] is None and c["src_shape"] != c["dst_shape"] \
                    and c["param"] == mapped:
                report.errors.append(f"{where}: shape mismatch; expected {c['dst_shape']}")
    left_unset = []
    for pname, (n_bad, bad_first) in unwritten.items():
        if n_bad:
            if pname in unused:
                left_unset.append(pname)
                continue
            report.errors.append(_describe_unfilled(pname, recorder.coverage[pname].shape, n_bad, bad_first,
                                                    by_param.get(pname, [])))
    if left_unset:
        report.notes.append(f"{len(left_unset)} vLLM parameter(s) left unset as planned (e.g. {left_unset[0]}): the "
                            "plan serves these experts weight-only, whose kernels never read input_scale")
    report.notes.append(NOT_RUN_NOTE)
    report.ok = not report.errors



def _dtype_pairing(src, dst) -> str:
    """'ok', 'narrowing' (values rounded) or 'bad' (bytes reinterpreted numerically) for copy_."""
    import torch

    if src == dst:
        return "ok"
    raw_bytes = {torch.uint8, torch.int8}
    if src in raw_bytes and dst in raw_bytes:
        return "ok"  # copy_ wraps modulo 256: the bit pattern of packed E2M1 is kept
    ints = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
    if src in ints and dst in ints and src not in raw_bytes:
        return "ok"  # index tables (tid2eid i64 -> i32)
    plain = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    if src in plain and dst in plain:
        return "ok" if plain.index(dst) >= plain.index(src) or {src, dst} == {torch.float16, torch.bfloat16} else "narrowing"
    return "bad"


def _describe_unfilled(name: str, shape: tuple, n_bad: int, bad_first: list[int], loads: list[dict]) -> str:
    """Which slice of ``name`` was never written, and which checkpoint tensor should have."""
    total = math.prod(shape)
    msg = f"vLLM parameter {name} {tuple(shape)}: {n_bad} of {total} elements never written"
    if any(ld.get("expert_id") is not None for ld in loads) and len(shape) >= 1:
        bad_e = bad_first
        shards = sorted({ld["shard_id"] for ld in loads if ld.get("shard_id") is not None})
        seen = {(ld["expert_id"], ld["shard_id"]) for ld in loads}
        missing = [(e, s) for e in bad_e for s in shards if (e, s) not in seen]
        if missing:
            ref = next(ld for ld in loads if ld.get("expert_id") is not None)
            head, rest = ref["checkpoint"].split(f".experts.{ref['expert_id']}.{ref['shard_ckpt']}.", 1)
            # vLLM's expert shard ids are the checkpoint's own projection names (w1, w2, w3)
            want = [f"{head}.experts.{e}.{s}.{rest}" for e, s in missing[:4]]
            msg += (f"; experts/shards never loaded: {missing[:8]}; expected checkpoint tensor(s) "
                    f"{', '.join(want)} (missing or misnamed in the checkpoint)")
    elif not loads:
        msg += "; no checkpoint tensor was loaded into it at all"
    return msg + ". Fix: add the tensor under its native DeepSeek-V4 name (see the doctor's missing list)"


def _torch_dtype(s: str):
    import torch

    return getattr(torch, s)


def recording_loader(pname: str, param, orig, calls: list, current: dict):
    """Wrap one parameter's weight_loader: record (checkpoint name, dtypes, shapes, shard) per call."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    inner = orig if orig is not None else default_weight_loader

    def loader(p, loaded_weight, *args, **kwargs):
        shard = kwargs.get("shard_id", args[1] if len(args) > 1 else (args[0] if args else None))
        expert = kwargs.get("expert_id")
        ck = current["name"]
        sh_ck = None
        if expert is not None and ck is not None:
            import re

            m = re.search(r"\.experts\.\d+\.(w[123])\.", ck)
            sh_ck = m.group(1) if m else None
        calls.append({"checkpoint": ck, "param": pname, "src_dtype": str(loaded_weight.dtype).replace("torch.", ""),
                      "dst_dtype": str(p.dtype).replace("torch.", ""), "src_shape": list(loaded_weight.shape),
                      "dst_shape": list(p.shape), "shard_id": shard if isinstance(shard, (str, int)) else None,
                      "expert_id": expert, "shard_ckpt": sh_ck})
        return inner(p, loaded_weight, *args, **kwargs)

    return loader
