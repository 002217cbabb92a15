"""The DeepseekV3-architecture family (``model.family=deepseek_v3``)."""
from nvfp4stack.models.deepseek_v3.family import DeepseekV3Family

FAMILY = DeepseekV3Family()
