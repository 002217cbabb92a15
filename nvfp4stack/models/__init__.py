"""The model-family plug-ins: one package per family, each exposing ``FAMILY`` (a
``nvfp4stack.families.family.ModelFamily``); nvfp4stack/families/registry.py reads this list."""
from pathlib import Path

# One line per family; adding a family adds one line here.
PACKAGES = (
    "nvfp4stack.models.deepseek_v4",
    "nvfp4stack.models.deepseek_v3",
    "nvfp4stack.models.qwen3_moe",
)

# The model a config without model=... gets (conf/model/tiny_v3.yaml: what `serve` runs by default).
DEFAULT_MODEL = {"name": "tiny_v3", "family": "deepseek_v3", "factory": "tiny_v3"}

# Weight-free config.json descriptors shared by the families (each family may keep its own in
# <family>/descriptors/).
DESCRIPTORS = Path(__file__).resolve().parent / "descriptors"
