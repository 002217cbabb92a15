"""One way to extend a step of vLLM's kernel warm-up from the plugin, in every process that loads it.

vLLM 0.26's ``kernel_warmup()`` (``vllm/model_executor/warmup/kernel_warmup.py``) calls its steps through that
module's globals (``deep_gemm_warmup`` and the model-specific ones), so a plugin that replaces the name there
changes what every worker runs, without touching vLLM's source. ``wrap_step`` does that once per process.
"""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("vllm.nvfp4stack")

_MARK = "__nvfp4stack_wrapped__"


def wrap_step(name: str, make: Callable[[Callable], Callable]) -> bool:
    """Replace ``kernel_warmup.<name>`` with ``make(vllms_step)``; True when wrapped (now or by an earlier call in
    this process), False where this vLLM has no such step (another version, no CUDA build)."""
    try:
        from vllm.model_executor.warmup import kernel_warmup
    except ImportError as e:
        log.debug("nvfp4stack: no vLLM kernel_warmup to extend (%s)", e)
        return False
    except Exception as e:   # never let an optional warm-up stop vLLM's plugin loading
        log.warning("nvfp4stack: vLLM's kernel_warmup could not be imported (%s: %s); %s left as it is",
                    type(e).__name__, e, name)
        return False
    vllms = getattr(kernel_warmup, name, None)
    if vllms is None:
        return False
    if getattr(vllms, _MARK, False):
        return True
    wrapped = make(vllms)
    setattr(wrapped, _MARK, True)
    setattr(kernel_warmup, name, wrapped)
    return True
