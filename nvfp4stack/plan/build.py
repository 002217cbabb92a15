"""Build the plan for a typed root config: the one entry point tasks use."""
from __future__ import annotations

from nvfp4stack.arch import Arch, resolve
from nvfp4stack.families.family import ModelFamily
from nvfp4stack.families.registry import get_family
from nvfp4stack.families.resolve import config_json_path, header_dir, with_num_layers
from nvfp4stack.plan.groups import groups_from_checkpoint, load_config_json
from nvfp4stack.plan.kv_cache import kv_cache_report
from nvfp4stack.plan.memory import Layout, draft_loaded
from nvfp4stack.plan.planner import Plan, build_plan


def layout_of(engine) -> Layout:
    return Layout(tp=int(getattr(engine, "tp", 1)), dp=int(getattr(engine, "dp", 1)), ep=bool(getattr(engine, "ep", False)))


def model_config(cfg) -> dict:
    """The model's config.json as the engine will run it: cut to ``model.num_layers`` when set."""
    return with_num_layers(load_config_json(config_json_path(cfg.model, cfg.cache_dir)), cfg.model.num_layers)


def plan_groups(cfg, family: ModelFamily | None = None):
    """(group, stored scheme) pairs: from the checkpoint's headers when there are weights (a trained
    factory's random twin: the same headers), else from config.json alone through the model family's
    spec (``ModelFamily.tensor_groups``, for weight-free descriptors). ``family``: ``cfg.model.family``'s
    ModelFamily when the caller has it already."""
    hf = model_config(cfg)
    family = family or get_family(cfg.model.family)
    ckpt = header_dir(cfg.model, cfg.cache_dir) if (cfg.model.path or cfg.model.factory) else None
    if ckpt is not None and any(ckpt.glob("*.safetensors")):
        return hf, list(groups_from_checkpoint(ckpt, hf.get("num_hidden_layers"), family))
    spec = family.tensor_groups(hf)
    if spec is None:
        raise FileNotFoundError(f"model {cfg.model.name}: no weights to plan from, and model family {family.name} "
                                "plans no model from config.json alone; set model.path=<checkpoint dir>")
    declared = family.config_source_format(hf)
    if declared is not None and declared != cfg.model.source_format:
        raise ValueError(f"model.source_format={cfg.model.source_format!r}: the weight-free config.json of model "
                         f"{cfg.model.name} ({config_json_path(cfg.model, cfg.cache_dir)}) declares {declared!r} "
                         f"weights (its quantization_config), and no weight files say otherwise; fix: "
                         f"model.source_format={declared}")
    return hf, [(g, family.source_scheme(g, cfg.model.source_format)) for g in spec]


def plan_for_config(cfg, arch: Arch | None = None, backend=None, groups=None) -> Plan:
    """The recipe's plan: every command that decides precision or kernels (plan, convert, serve,
    eval, doctor, bench) takes it from here. ``groups``: ``plan_groups(cfg, family)``, when the caller
    has read them already. The model family is looked up here, once, and travels as an object from
    here on."""
    family = get_family(cfg.model.family)
    hf, groups = plan_groups(cfg, family) if groups is None else groups
    return build_plan(
        groups, model=cfg.model.name, family=family, arch=arch or resolve(cfg.arch.name),
        source_format=cfg.model.source_format, precision=cfg.precision, backend=backend or cfg.backend,
        layout=layout_of(cfg.engine), fp8_ue8m0=cfg.precision.fp8_scale_fmt == "ue8m0",
        num_hidden_layers=hf.get("num_hidden_layers"), draft_loaded=draft_loaded(cfg.engine),
    )


def kv_cache_for_config(cfg, plan: Plan) -> dict | None:
    """The KV cache that fits beside ``plan``'s per-GPU weights (``kv_cache_report``): ``plan``
    prints it, and ``plan`` and ``serve`` refuse a layout where nothing fits (``nothing_fits``)."""
    return kv_cache_report(model_config(cfg), cfg.engine, cfg.arch, plan.gpu_bytes, get_family(cfg.model.family))
