"""vLLM load format ``synthetic``: a full-size model with no checkpoint on disk.

Registered by the plugin (``register_model_loader``) in every vLLM process. ``--model`` points at a
weight-free directory (config.json and a tokenizer, ``nvfp4stack/models/synthetic_dir.py``); the
model family draws every tensor its checkpoint would store, in the checkpoint's own layout, on the
device vLLM builds the model on (``ModelFamily.synthetic_weights``), and vLLM's own
``model.load_weights`` takes them: its name mapping, TP/EP split and quantization methods apply
exactly as for files, the plugin's load-time cast included. Each tensor's values come from
(``--model-loader-extra-config '{"seed": N}'``, tensor name) alone, so every rank split and every
MoE backend gets the same weights (a family may instead draw its stream in order from one generator, as
its synthetic benchmark model's files hold it: every rank draws all of it, with the same result; see the
family's ``synthetic_weights``). Unlike vLLM's ``dummy`` loader, integer parameters (MXFP4 codes,
UE8M0 scales) hold valid values, and FP8 scales lie in the release's range.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from nvfp4stack.engine.args import SYNTHETIC as LOAD_FORMAT
from nvfp4stack.engine.compat import check_all_weights_loaded
from nvfp4stack.families.registry import family_for_config

EXTRA_KEYS = ("seed",)
log = logging.getLogger("vllm.nvfp4stack")


class SyntheticModelLoader(BaseModelLoader):
    def __init__(self, load_config):
        super().__init__(load_config)
        extra = dict(load_config.model_loader_extra_config or {})
        unknown = sorted(set(extra) - set(EXTRA_KEYS))
        if unknown:
            raise ValueError(f"--model-loader-extra-config: load format {LOAD_FORMAT!r} takes {', '.join(EXTRA_KEYS)}; "
                             f"found {unknown}. Fix: pass e.g. '{{\"seed\": 0}}' (engine.synthetic_seed)")
        self.seed = int(extra.get("seed", 0))

    def download_model(self, model_config) -> None:
        pass  # nothing to download: the weights are drawn at load

    def load_weights(self, model: torch.nn.Module, model_config) -> None:
        cfg_path = Path(model_config.model) / "config.json"
        config = json.loads(cfg_path.read_text())
        family = family_for_config(config, where=str(cfg_path))
        device = next(model.parameters()).device
        # vLLM's speculative draft (runner "draft") loads only its own block: the rest is not drawn for it
        draft = getattr(model_config, "runner_type", None) == "draft"
        log.info("nvfp4stack: synthetic weights of %s (seed %d%s) drawn on %s", family.name, self.seed,
                 ", the draft's only" if draft else "", device)
        with torch.no_grad():
            loaded = model.load_weights(family.synthetic_weights(config, self.seed, device, draft=draft))
        check_all_weights_loaded(self.load_config, model, set(loaded), model_config.quantization is not None)


def register() -> None:
    from vllm.model_executor.model_loader import register_model_loader

    register_model_loader(LOAD_FORMAT)(SyntheticModelLoader)
