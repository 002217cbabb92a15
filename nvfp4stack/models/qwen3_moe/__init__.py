"""The Qwen3-MoE family (``model.family=qwen3_moe``)."""
from nvfp4stack.models.qwen3_moe.family import Qwen3MoeFamily

FAMILY = Qwen3MoeFamily()
