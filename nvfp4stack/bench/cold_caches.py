"""Where a vLLM server's JIT and compile caches live, so that a benchmark start can meet none of them.

``bench.engine_cold_caches=true`` gives every server start of ``bench=engine`` its own empty cache
directories: its ready time is then what a fresh machine pays (Triton's kernels, ours and vLLM's;
inductor's and vLLM's torch.compile artifacts; DeepGEMM, FlashInfer, TVM-FFI and CUDA's JIT), bar the
operating system's page cache. Each variable is the one its library reads for its cache root.
"""
from __future__ import annotations

from pathlib import Path

# variable -> sub-directory of the start's cache root
CACHE_VARS: dict[str, str] = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "VLLM_CACHE_ROOT": "vllm",               # vLLM's torch.compile cache and its own downloads
    "XDG_CACHE_HOME": "xdg",                 # ~/.cache for the libraries that follow XDG
    "DG_JIT_CACHE_DIR": "deep_gemm",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TVM_FFI_CACHE_DIR": "tvm_ffi",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "CUDA_CACHE_PATH": "cuda",               # the driver's PTX -> SASS cache
}


def cold_cache_env(root: str | Path) -> dict[str, str]:
    """One empty cache directory per variable under ``root`` (created), as environment entries."""
    root = Path(root)
    env = {}
    for var, sub in CACHE_VARS.items():
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
    return env
