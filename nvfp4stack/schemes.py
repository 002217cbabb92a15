"""Precision schemes a tensor group can be planned to."""
from __future__ import annotations

from enum import Enum


class Scheme(str, Enum):
    NVFP4 = "nvfp4"              # W4A4: E2M1 weights + UE4M3/16 scales + fp32 global; activations NVFP4
    NVFP4_W4A16 = "nvfp4_w4a16"  # NVFP4 weights, bf16 activations (the only NVFP4 path on sm_90)
    MXFP4 = "mxfp4"              # E2M1 + UE8M0 per 32 (the format some releases ship routed experts in)
    FP8_BLOCK = "fp8_block"      # E4M3 with 128x128 block scales (UE8M0 or fp32)
    BF16 = "bf16"
    PASSTHROUGH = "passthrough"  # copied byte for byte, whatever it is

    @classmethod
    def parse(cls, value: str, where: str = "scheme") -> "Scheme":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"{where}: unknown scheme {value!r}; valid: {', '.join(s.value for s in cls)}"
            ) from None

    @property
    def is_nvfp4(self) -> bool:
        return self in (Scheme.NVFP4, Scheme.NVFP4_W4A16)

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight, scales included."""
        return {
            Scheme.NVFP4: 4 + 8 / 16,
            Scheme.NVFP4_W4A16: 4 + 8 / 16,
            Scheme.MXFP4: 4 + 8 / 32,
            Scheme.FP8_BLOCK: 8 + 32 / (128 * 128),
            Scheme.BF16: 16,
            Scheme.PASSTHROUGH: 16,
        }[self]
