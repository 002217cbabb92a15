"""The default recipe's DeepseekV3 family has a quantize: modelopt NVFP4 experts into the run's
output directory, the checkpoint doctor accepts and serve takes; a bad method exits 2 naming the key."""
from __future__ import annotations

import json

import pytest

from nvfp4stack.cli import compose_config


def _cfg(tmp_path, *overrides):
    return compose_config("command=quantize", "model.factory=tiny_v3_random", f"run_dir={tmp_path / 'run'}",
                          f"cache_dir={tmp_path / 'cache'}", "quantize.calib_samples=4", "quantize.calib_seq_len=32",
                          *overrides)


@pytest.mark.slow
def test_quantize_writes_a_modelopt_nvfp4_checkpoint(tmp_path, capsys):
    from nvfp4stack.doctor import diagnose
    from nvfp4stack.doctor.plan import check_plan_agreement
    from nvfp4stack.families.registry import get_family
    from nvfp4stack.plan.build import plan_for_config

    cfg = _cfg(tmp_path)
    assert get_family("deepseek_v3").quantize(cfg) == 0
    out = tmp_path / "run" / "quantized"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"quantize: wrote {out} (modelopt NVFP4_EXPERTS_ONLY_CFG")
    assert f"doctor checkpoint={out}" in last and f"serve model.path={out}" in last
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "modelopt" and q["quant_algo"] == "NVFP4"
    assert not list(out.parent.glob("*.tmp*")), "no temporary directory left"
    # the doctor, against the same recipe's plan: no error (the family has no vLLM load check: stated)
    import dataclasses

    plan = plan_for_config(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(out),
                                                                              factory=None)))
    report = diagnose(out, vllm="off", plan=plan)
    check_plan_agreement(plan, out, report)
    assert report.errors == [], report.table()


def test_cast_is_refused_naming_the_key(tmp_path):
    from nvfp4stack.families.registry import get_family

    with pytest.raises(ValueError, match=r"^quantize.method='cast': model family 'deepseek_v3' quantizes with "
                                         r"modelopt only.*Fix: quantize.method=modelopt"):
        get_family("deepseek_v3").quantize(_cfg(tmp_path, "quantize.method=cast"))
    assert not (tmp_path / "run" / "quantized").exists()
