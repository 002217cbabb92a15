"""How modelopt_ptq loads the model it calibrates: BF16, spread over the GPUs where there are any."""
import torch

from nvfp4stack.quantize.modelopt_ptq import load_kwargs


def test_load_kwargs_spread_over_gpus_only_where_there_are_some(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_kwargs() == {"dtype": torch.bfloat16}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert load_kwargs() == {"dtype": torch.bfloat16, "device_map": "auto"}
