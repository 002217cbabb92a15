"""The backends x archs table of the README, generated from the registry (``python -m nvfp4stack.kernels.table``)."""
from __future__ import annotations

from nvfp4stack.arch import KNOWN_ARCHS
from nvfp4stack.kernels.base import load_backends, registry_for

_SHORT = {"nvfp4": "nvfp4", "nvfp4_w4a16": "w4a16", "mxfp4": "mxfp4", "fp8_block": "fp8b"}


def cell(backend, arch) -> str:
    """Schemes the backend runs on the arch; an NVFP4 checkpoint served weight-only shows 'nvfp4→w4a16'."""
    out = []
    for s in backend.capabilities.schemes:
        if backend.is_supported(arch, s)[0]:
            label = _SHORT[s.value]
            if s.value == "nvfp4" and not backend.capabilities.activation_fp4:
                label = "nvfp4→w4a16"
            if label == "w4a16" and "nvfp4→w4a16" in out:
                continue  # the same kernel path, said once
            out.append(label)
    return ", ".join(out) if out else "—"


def markdown() -> str:
    load_backends()
    archs = [KNOWN_ARCHS[a] for a in KNOWN_ARCHS]
    lines = ["| kind | backend | provider | " + " | ".join(a.name for a in archs) + " |",
             "|---|---|---|" + "---|" * len(archs)]
    for kind in ("moe", "linear"):
        reg = registry_for(kind)
        for name in reg.names():
            b = reg.get(name)
            lines.append(f"| {kind} | {name} | {b.capabilities.provider} | " + " | ".join(cell(b, a) for a in archs) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
