"""DeepSeek-V4 ``quantize``: modelopt PTQ (or a data-free cast) into modelopt's DSV4 layout, or
modelopt's unified HF export (``quantize.export_format=hf_unified``)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.io_atomic import atomic_dir


def resolve_sources(cfg) -> tuple[Path | None, Path]:
    """(BF16 source dir or None, release-format base dir) from quantize.source/base or the model config."""
    q, m = cfg.quantize, cfg.model
    if q.source or q.base:
        src = Path(q.source).expanduser() if q.source else None
        base = Path(q.base or q.source).expanduser()
        return src, base
    if getattr(m, "factory", None) == "tiny_dsv4":
        from nvfp4stack.families.registry import factories
        from nvfp4stack.families.resolve import cache_root

        build = factories()["tiny_dsv4"]
        return build(cache_root(cfg.cache_dir), "bf16"), build(cache_root(cfg.cache_dir), "official")
    path = getattr(m, "path", None)
    if not path:
        raise ValueError(f"model.path: expected a checkpoint directory for model {m.name!r} (or set "
                         "quantize.source / quantize.base), found none; set model.path=DIR")
    fmt = getattr(m, "source_format", "bf16")
    return (Path(path).expanduser() if fmt == "bf16" else None), Path(path).expanduser()


def _expert_groups(base: ShardedReader, quantize_mtp: bool) -> list[str]:
    from nvfp4stack.models.deepseek_v4.export import EXPERT_WEIGHT

    return [n[: -len(".weight")] for n in base.names()
            if EXPERT_WEIGHT.match(n) and (quantize_mtp or not n.startswith("mtp."))]


def _check_base(base: Path) -> None:
    cfg = json.loads((base / "config.json").read_text())
    qm = (cfg.get("quantization_config") or {}).get("quant_method")
    if qm != "fp8":
        raise ValueError(f"quantize.base={base}: expected the release format (quantization_config.quant_method "
                         f"fp8: FP8 attention + MXFP4 experts), found quant_method={qm!r}; modelopt's DSV4 "
                         "layout keeps the release's FP8 path: point quantize.base at a release-format "
                         "checkpoint, or use quantize.export_format=hf_unified")


def _export_hf_unified(source: Path, out: Path, q) -> dict:
    """modelopt's generic export_hf_checkpoint of the calibrated transformers model."""
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    from nvfp4stack.models.deepseek_v4.calibrate import calibrate_dsv4
    from nvfp4stack.models.deepseek_v4.config_fixups import topk_method_noaux_tc
    from nvfp4stack.quantize.modelopt_ptq import TOKENIZER_FILES

    amax, stats, model = calibrate_dsv4(source, samples=q.calib_samples, seq_len=q.calib_seq_len,
                                        batch_size=q.calib_batch_size, seed=q.seed, keep_model=True)
    model.to(torch.bfloat16)  # modelopt's export of DSV4 on CPU wants bf16 weights
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        with torch.inference_mode():
            export_hf_checkpoint(model, export_dir=tmp)
        cfg = topk_method_noaux_tc(json.loads((tmp / "config.json").read_text()))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for name in TOKENIZER_FILES:
            if (source / name).exists():
                shutil.copy2(source / name, tmp / name)
    return stats


def _amax_lookup(amax: dict, where: str):
    """``path -> activation amax`` from a calibration state (per expert, else per projection)."""
    from nvfp4stack.models.deepseek_v4.export import merge_amax

    merged, fallback = merge_amax(amax)

    def from_state(path: str):
        a = merged.get(f"{path}_input_quantizer._amax", fallback.get(path.rsplit(".", 1)[1]))
        if a is None:
            raise KeyError(f"{where}: no input amax for {path} nor for its projection; recalibrate "
                           "or set quantize.cast_input_amax")
        return a
    return from_state


def cast_activation_target(cfg, base_dir: Path, quantize_mtp: bool) -> tuple[bool, str]:
    """(needs activation amax, what the plan serves) for the routed experts a cast writes.

    The plan of the release checkpoint under the config's precision, arch and backend decides:
    experts served W4A4 (NVFP4 activations) need a calibrated ``input_scale``; weight-only ones
    (``precision.routed_experts=nvfp4_w4a16``, or an arch/backend that runs NVFP4 as W4A16) never
    read it.
    """
    from nvfp4stack.arch import resolve
    from nvfp4stack.families.registry import get_family
    from nvfp4stack.plan.build import layout_of
    from nvfp4stack.plan.groups import groups_from_checkpoint, load_config_json
    from nvfp4stack.plan.planner import build_plan
    from nvfp4stack.schemes import Scheme

    hf = load_config_json(base_dir / "config.json")
    plan = build_plan(groups_from_checkpoint(base_dir, hf.get("num_hidden_layers")), model=cfg.model.name,
                      family=get_family(cfg.model.family), arch=resolve(cfg.arch.name), source_format="official",
                      precision=cfg.precision, backend=cfg.backend, layout=layout_of(cfg.engine),
                      fp8_ue8m0=cfg.precision.fp8_scale_fmt == "ue8m0")
    experts = [g for g in plan.groups if g.role == "routed_experts" and (quantize_mtp or not g.mtp)
               and g.target in (Scheme.NVFP4, Scheme.NVFP4_W4A16)]
    served = sorted({f"{g.served.value} on {g.kernel}" for g in experts})
    where = f"routed experts served {', '.join(served) or 'not as NVFP4'} on {plan.arch}"
    return any(g.served is Scheme.NVFP4 for g in experts), where


def _cast_input_amax(q, source, state_dir: Path, recipe: str, needs_amax: bool, target: str):
    """Where a cast's activation amax (-> input_scale) comes from, in order: quantize.amax_path, a
    constant quantize.cast_input_amax; then, for a weight-only (W4A16) target, none at all (a unit
    placeholder input_scale); for a W4A4 target, a calibration of activations only on the BF16
    source (the weights stay a data-free cast). A W4A4 target with none of them stops."""
    import torch

    from nvfp4stack.models.deepseek_v4.calib_state import load_state, save_state
    from nvfp4stack.models.deepseek_v4.cast import W4A16_PLACEHOLDER_AMAX

    if q.amax_path:
        amax, _ = load_state(q.amax_path)
        return _amax_lookup(amax, f"quantize.amax_path={q.amax_path}"), "amax_path"
    if q.cast_input_amax is not None:
        const = torch.tensor(float(q.cast_input_amax))
        return (lambda path: const), "cast_input_amax"
    if not needs_amax:
        print(f"quantize: cast: {target}: weight-only, so no activation amax is needed; this checkpoint "
              "is W4A16-only (input_scale = 1.0 placeholder, never read by weight-only kernels). For W4A4 "
              f"serving, re-run with quantize.amax_path=<calib_state> (`python main.py recipe={recipe} "
              "quantize` writes one) or quantize.cast_input_amax=X", flush=True)
        placeholder = torch.tensor(W4A16_PLACEHOLDER_AMAX)
        return (lambda path: placeholder), "w4a16_placeholder"
    if source is not None:
        from nvfp4stack.models.deepseek_v4.calibrate import calibrate_dsv4

        print(f"quantize: cast: {target} (W4A4) needs activation amax and none was given; calibrating "
              f"activations only on the BF16 source {source} ({q.calib_samples} samples; the weights stay "
              "a data-free cast)", flush=True)
        amax, meta = calibrate_dsv4(source, samples=q.calib_samples, seq_len=q.calib_seq_len,
                                    batch_size=q.calib_batch_size, seed=q.seed)
        meta["source"] = str(source)
        save_state(state_dir, amax, meta)
        return _amax_lookup(amax, f"calibration state {state_dir}"), "calibrated_activations"
    raise ValueError(
        f"quantize.amax_path: the cast's {target} (W4A4) need an activation amax for input_scale, found "
        "no quantize.amax_path, no quantize.cast_input_amax and no BF16 quantize.source to calibrate on; "
        f"fix: `python main.py recipe={recipe} quantize quantize.method=cast quantize.source=<BF16 "
        f"checkpoint>` (calibrates activations), or `python main.py recipe={recipe} quantize` once and "
        "then pass quantize.amax_path=<its run dir>/calib_state, or quantize.cast_input_amax=<amax>, or "
        "cast weight-only with precision.routed_experts=nvfp4_w4a16")


def run(cfg) -> int:
    """Quantize per cfg.quantize; write the checkpoint, the calibration state and the run report.

    Returns 0 on success; validate_only returns 1 when the saved state has problems.
    """
    from nvfp4stack.models.deepseek_v4.calib_state import load_state, save_state, validate_state
    from nvfp4stack.models.deepseek_v4.export import CalibratedExperts, export_dsv4
    from nvfp4stack.quantize.report import write_report

    q = cfg.quantize
    run_dir = Path(cfg.run_dir).expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Path(q.output_dir).expanduser() if q.output_dir else run_dir / "quantized"
    state_dir = Path(q.state_dir).expanduser() if q.state_dir else run_dir / "calib_state"
    source, base_dir = resolve_sources(cfg)
    extra: dict = {"quantize_mtp": q.mtp == "nvfp4"}

    if q.method == "modelopt" and q.export_format == "hf_unified":
        if source is None:
            raise ValueError("quantize.source: export_format=hf_unified calibrates the BF16 model; set it")
        extra["calibration"] = _export_hf_unified(source, out, q)
        write_report(run_dir, method="modelopt/hf_unified", out_dir=out, before_dir=source,
                     reference_dir=source, extra=extra, family=cfg.model.family)
        print(f"quantize: wrote {out} (modelopt unified HF export)")
        return 0

    _check_base(base_dir)
    base = ShardedReader(base_dir)
    src_reader = ShardedReader(source) if source else None
    if q.method == "modelopt":
        if q.validate_only:
            amax, meta = load_state(state_dir)
            problems = validate_state(amax, meta, _expert_groups(base, q.mtp == "nvfp4"))
            for p in problems:
                print(f"quantize.validate_only: {p}")
            print(f"quantize.validate_only: {state_dir}: {len(amax)} amax, "
                  f"{'valid' if not problems else f'{len(problems)} problem(s)'}")
            return 0 if not problems else 1
        if q.export_only:
            amax, meta = load_state(state_dir)
        else:
            if source is None:
                raise ValueError("quantize.source: method=modelopt calibrates a BF16 DeepSeek-native "
                                 "checkpoint; set quantize.source=DIR (layout a)")
            from nvfp4stack.models.deepseek_v4.calibrate import calibrate_dsv4

            amax, meta = calibrate_dsv4(source, samples=q.calib_samples, seq_len=q.calib_seq_len,
                                        batch_size=q.calib_batch_size, seed=q.seed)
            meta["source"] = str(source)
            save_state(state_dir, amax, meta)  # before export: a crash from here on keeps calibration
        extra["calibration"] = meta
        make = CalibratedExperts(base, src_reader, amax)
    else:
        needs_amax, target = cast_activation_target(cfg, base_dir, q.mtp == "nvfp4")
        input_amax, extra["input_amax_from"] = _cast_input_amax(q, source, state_dir, cfg.recipe,
                                                                needs_amax, target)
        extra["activations"] = "w4a4" if needs_amax else "w4a16_only"
        from nvfp4stack.models.deepseek_v4.cast import CastExperts

        make = CastExperts(base, input_amax)
    export_dsv4(base_dir, out, make, quantize_mtp=q.mtp == "nvfp4")
    extra["export_stats"] = dict(make.stats)
    report = write_report(run_dir, method=q.method, out_dir=out, before_dir=base_dir,
                          reference_dir=source, extra=extra, family=cfg.model.family)
    rel = report["weight_error_vs_bf16"].get("routed_experts", {}).get("rel_error")
    only = " (W4A16-only: placeholder input_scale)" if extra.get("activations") == "w4a16_only" else ""
    print(f"quantize: wrote {out}{only}; routed-expert rel error vs BF16 = {rel}; "
          f"bytes {report['bytes_before']:,} -> {report['bytes_after']:,}; report in {run_dir}")
    return 0
