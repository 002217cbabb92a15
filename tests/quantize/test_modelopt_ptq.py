"""How modelopt_ptq loads the model it calibrates (BF16, safetensors only, spread over the GPUs
where there are any) and how it keeps the amax snapshot (safetensors, never a pickle)."""
import re
from pathlib import Path

import torch

from nvfp4stack.quantize.modelopt_ptq import AMAX_FILE, load_amax, load_kwargs, save_amax

ROOT = Path(__file__).resolve().parents[2]


def test_load_kwargs_spread_over_gpus_only_where_there_are_some(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_kwargs() == {"dtype": torch.bfloat16, "use_safetensors": True}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert load_kwargs() == {"dtype": torch.bfloat16, "use_safetensors": True, "device_map": "auto"}


def test_amax_snapshot_is_safetensors_in_a_subdirectory(tmp_path, seed):
    g = torch.Generator().manual_seed(seed)
    amax = {"model.layers.1.mlp.experts.gate_up_proj_weight_quantizers.3": torch.rand((), generator=g) * 9,
            "model.layers.1.mlp.experts.down_proj_input_quantizer": torch.rand((), generator=g) * 30,
            "model.layers.0.self_attn.o_proj.weight_quantizer": torch.rand(4, 1, generator=g)}
    path = save_amax(amax, tmp_path / AMAX_FILE, "NVFP4_EXPERTS_ONLY_CFG")
    # not at the top level, where vLLM would load it as weights of a checkpoint without an index
    assert path.parent != tmp_path and path.suffix == ".safetensors"
    raw = path.read_bytes()
    assert raw[8:9] == b"{" and not raw.startswith((b"\x80", b"PK"))  # a JSON header, no pickle or zip
    back = load_amax(path)
    assert back.keys() == amax.keys() and all(torch.equal(back[k], v) for k, v in amax.items())
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["amax.safetensors"]


def test_the_package_writes_no_pickle():
    """No torch.save / pickle.dump / np.save anywhere: what the project writes is safetensors or text."""
    bad = []
    for path in sorted((ROOT / "nvfp4stack").rglob("*.py")) + [ROOT / "main.py"]:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\btorch\.save\(|\bpickle\.dumps?\(|\bnp\.save[z]?\(|\bjoblib\.dump\(|\bdill\b", code):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "pickle writing found (write safetensors + json instead):\n" + "\n".join(bad)
