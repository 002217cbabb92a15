"""The DeepSeek-V4 family (``model.family=deepseek_v4``)."""
from nvfp4stack.models.deepseek_v4.family import DeepseekV4Family

FAMILY = DeepseekV4Family()
