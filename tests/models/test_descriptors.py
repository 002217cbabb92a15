"""The shipped DeepSeek-V4 descriptors are config.json files both configs read: transformers'
DeepseekV4Config (AutoConfig) and vLLM's own, with every field vLLM's DeepSeek-V4 model reads."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.models import DESCRIPTORS
from nvfp4stack.models.deepseek_v4.doctor_config import REQUIRED, check_config

DSV4 = sorted(p for p in DESCRIPTORS.glob("*.json") if json.loads(p.read_text()).get("model_type") == "deepseek_v4")
_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def test_the_dsv4_descriptors_are_found():
    assert {p.stem for p in DSV4} >= {"dsv4_flash", "dsv4_pro"}


@pytest.fixture(params=DSV4, ids=lambda p: p.stem)
def model_dir(request, tmp_path) -> Path:
    shutil.copy(request.param, tmp_path / "config.json")
    return tmp_path


def test_transformers_reads_it(model_dir):
    from transformers import AutoConfig

    raw = json.loads((model_dir / "config.json").read_text())
    c = AutoConfig.from_pretrained(model_dir)
    assert type(c).__name__ == "DeepseekV4Config"
    for k in ("hidden_size", "num_hidden_layers", "n_routed_experts", "moe_intermediate_size", "hidden_act"):
        assert getattr(c, k) == raw[k], k
    # transformers folds the legacy fields vLLM reads into its own: the same schedule
    assert c.layer_types == [_TYPES[r] for r in raw["compress_ratios"][: raw["num_hidden_layers"]]]
    assert c.mlp_layer_types[: raw["num_hash_layers"] + 1] == ["hash_moe"] * raw["num_hash_layers"] + ["moe"]
    assert c.qk_rope_head_dim == raw["qk_rope_head_dim"]
    # and saves a file it reads back the same
    c.save_pretrained(model_dir / "saved")
    again = AutoConfig.from_pretrained(model_dir / "saved")
    assert again.layer_types == c.layer_types and again.hidden_act == c.hidden_act


@pytest.fixture(scope="module")
def vllm_read(tmp_path_factory) -> dict[str, dict]:
    """descriptor stem -> what vLLM's get_config read from it. In one child process for every descriptor (vLLM's
    import is most of its time): vLLM's get_config registers its own DeepseekV4Config with transformers'
    AutoConfig, which would change what later tests of this process read."""
    pytest.importorskip("vllm")
    import subprocess
    import sys

    dirs = {}
    for src in DSV4:
        dirs[src.stem] = tmp_path_factory.mktemp(f"vllm_{src.stem}_")
        shutil.copy(src, dirs[src.stem] / "config.json")
    code = ("import json, sys; from vllm.transformers_utils.config import get_config\n"
            "keys = json.loads(sys.argv[1])\n"
            "for d in sys.argv[2:]:\n"
            "    c = get_config(d, trust_remote_code=False)\n"
            "    print(json.dumps({'module': type(c).__module__, 'missing': [k for k in keys if getattr(c, k, None) is None],"
            " 'hidden_act': c.hidden_act, 'tie': c.tie_word_embeddings, 'rope': c.rope_parameters}))")
    keys = [*REQUIRED, "compress_ratios", "rope_parameters"]
    r = subprocess.run([sys.executable, "-c", code, json.dumps(keys), *map(str, dirs.values())], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    read = [json.loads(line) for line in r.stdout.strip().splitlines()[-len(dirs):]]
    return dict(zip(dirs, read))


def test_vllm_reads_every_field_its_dsv4_uses(model_dir, vllm_read, request):
    c = vllm_read[request.node.callspec.params["model_dir"].stem]   # this descriptor's, as vLLM read it
    assert c["module"] == "vllm.transformers_utils.configs.deepseek_v4"
    assert c["missing"] == []
    assert c["hidden_act"] == "silu" and c["tie"] is False
    assert c["rope"]["rope_type"] == "yarn" and c["rope"]["factor"] == 16


def test_doctor_config_check_passes(model_dir):
    report = DoctorReport("descriptor")
    cfg = json.loads((model_dir / "config.json").read_text())
    check_config(cfg, None, set(), report)
    assert report.errors == [], [f.line() for f in report.errors]
    check_config({k: v for k, v in cfg.items() if k != "hidden_act"}, None, set(), report)
    assert [(f.check, f.where, f.found) for f in report.errors] == [("config", "config.json:hidden_act", "absent")]
