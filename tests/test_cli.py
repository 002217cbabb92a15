"""The CLI shim and the config tree: bare command words, recipes, groups, errors, multirun."""
import json
import os
import subprocess
import sys
import time

import pytest

from nvfp4stack.cli import CONF_DIR, RECIPES_DIR, ROOT, UsageError, compose_config, split_command
from nvfp4stack.config import GROUPS, RootConfig
from nvfp4stack.overrides import check_overrides, field_path
from nvfp4stack.usage import COMMANDS

RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def compose(*overrides: str) -> RootConfig:
    return compose_config(*overrides, "run_dir=/tmp/unused")


def test_command_word_in_any_position():
    assert split_command(["recipe=dsv4_b200", "serve"]) == ("serve", ["recipe=dsv4_b200"], [])
    assert split_command(["plan", "recipe=x", "-m"]) == ("plan", ["recipe=x"], ["-m"])
    assert split_command(["--cfg", "job", "a=1", "plan"]) == ("plan", ["a=1"], ["--cfg", "job"])


def test_bad_command_line_is_a_clear_usage_error(capsys):
    with pytest.raises(UsageError):
        split_command(["recipe=x", "servee"])
    assert "unknown command 'servee'; valid commands: plan, quantize, convert, serve" in capsys.readouterr().err
    with pytest.raises(UsageError):
        split_command(["plan", "serve"])
    with pytest.raises(UsageError):
        check_overrides(["engine.tpp=2"])
    assert "engine has no 'tpp'; valid keys there: " in capsys.readouterr().err
    check_overrides(["engine.tp=2", "arch=sm90", "precision.attn.wo_a=bf16", "hydra.verbose=true", "engine.tp='4'",
                     "backend.moe=cutedsl,marlin", "precision.rules=[{targets:[embed],ignore:[head],scheme:bf16}]",
                     "engine.tp=${oc.env:TP,1}", "engine.speculative={method:mtp}", "model.path=null"])


def test_default_recipe_is_tiny_cpu():
    cfg = compose()
    assert cfg.recipe == "tiny_cpu" and cfg.model.name == "tiny_v3" and cfg.arch.name == "cpu"


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_and_only_overrides(recipe):
    cfg = compose(f"recipe={recipe}")
    assert cfg.recipe == recipe
    text = (RECIPES_DIR / f"{recipe}.yaml").read_text()
    assert text.startswith("# @package _global_") or "# @package _global_" in text.splitlines()[0:5]


def test_every_group_option_composes():
    for group in GROUPS:
        for option in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
            cfg = compose(f"{group}={option}")
            assert isinstance(getattr(cfg, group), GROUPS[group]), (group, option)


def test_recipe_requirements():
    b200 = compose("recipe=dsv4_b200")
    assert (b200.model.name, b200.arch.name, b200.engine.tp, b200.engine.ep) == ("dsv4_pro", "sm100a", 8, True)
    assert b200.precision.attn.wo_a == "fp8_block" and b200.precision.compressor == "bf16"
    assert b200.precision.indexer.weights_proj == "bf16" and b200.precision.mtp == "passthrough"
    assert b200.engine.kv_cache_dtype == "fp8" and b200.engine.block_size == 256
    assert b200.engine.speculative.method == "mtp" and b200.engine.speculative.num_speculative_tokens == 2
    assert b200.backend.moe in ("flashinfer_trtllm", "cutedsl", "flashinfer_cutedsl")
    h200 = compose("recipe=dsv4_h200")
    assert h200.arch.name == "sm90" and h200.backend.moe in ("triton_w4a16", "marlin")


def test_invalid_value_is_rejected():
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    with pytest.raises((HydraException, OmegaConfBaseException, ValueError), match="precision.routed_experts"):
        compose("precision.routed_experts=int3")


def _main(*args, cwd=ROOT, timeout=300):
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_plan_dsv4_b200_from_config_json_alone(tmp_path):
    r = _main("recipe=dsv4_b200", "plan", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert 1.5e12 <= plan["total_params"] <= 1.7e12
    assert 850e9 <= plan["total_bytes"] <= 1000e9
    assert plan["layout"] == {"tp": 8, "dp": 1, "ep": True}
    assert "per-GPU weight bytes (tp=8 dp=1 ep=True, 8 GPUs)" in r.stdout
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["versions"]["torch"] and "python" in manifest["versions"]
    assert (tmp_path / "config.yaml").exists()


def test_b200_recipe_on_sm90_refuses_blackwell_backends(tmp_path):
    """Exit 2 with the refusal as one line (what serve says too); the plan shown and written is the
    backend.moe=auto fallback, for comparison."""
    r = _main("recipe=dsv4_b200", "arch=sm90", "plan", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2, r.stderr
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "backend.moe=flashinfer_trtllm cannot run nvfp4 on sm90" in err[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert "REFUSED backend.moe=flashinfer_trtllm on sm90" in r.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["backend_checks"]["moe"]["valid"] is False
    assert plan["selections"]["moe:nvfp4"]["backend"] in ("triton_w4a16", "marlin")
    assert plan["selections"]["moe:nvfp4"]["served_scheme"] == "nvfp4_w4a16"


@pytest.mark.slow
def test_multirun_backend_sweep(tmp_path):
    r = _main("-m", "recipe=dsv4_b200", "backend.moe=cutedsl,flashinfer_trtllm,marlin,triton_w4a16", "plan",
              f"hydra.sweep.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    checks = {}
    for job in range(4):
        plan = json.loads((tmp_path / str(job) / "plan.json").read_text())
        c = plan["backend_checks"]["moe"]
        checks[c["backend"]] = c
        assert c["reason"]
    assert set(checks) == {"cutedsl", "flashinfer_trtllm", "marlin", "triton_w4a16"}
    assert all(c["valid"] for c in checks.values())
    assert checks["marlin"]["served_scheme"] == "nvfp4_w4a16"
    # the sweep's summary table (md + CSV), one row per job
    md = (tmp_path / "sweep_report.md").read_text()
    assert (tmp_path / "sweep_report.csv").exists() and "sweep report" in r.stdout
    for backend in ("cutedsl", "flashinfer_trtllm", "marlin", "triton_w4a16"):
        assert f"| {backend} |" in md
    assert "gpu_weight_bytes" in md or "gpu_weight_bytes=" in md


def _help(*args):
    start = time.perf_counter()
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True, text=True, timeout=60)
    return r, time.perf_counter() - start


@pytest.mark.parametrize("args", [(), ("--help",), ("-h", "recipe=dsv4_b200")])
def test_help_lists_every_command_fast_without_hydra_dump(args):
    r, seconds = _help(*args)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert seconds < 1.5, f"help took {seconds:.2f} s"
    for command in COMMANDS:
        assert f"\n  {command:<9} " in r.stdout, command
    assert "python main.py <command> --help" in r.stdout and "--hydra-help" in r.stdout
    assert "tiny_cpu" in r.stdout and "== Config ==" not in r.stdout and "Powered by Hydra" not in r.stdout
    assert len(r.stdout.splitlines()) < 30


def test_command_help_gives_keys_and_examples():
    r, seconds = _help("recipe=qwen3_235b_b200", "serve", "--help")
    assert r.returncode == 0 and seconds < 1.5, (r.stderr, seconds)
    assert r.stdout.splitlines()[2].startswith("serve: vLLM's OpenAI server")
    assert "main keys: model.path, engine.host" in r.stdout
    assert "  python main.py recipe=qwen3_235b_b200 serve engine.dry_run=true" in r.stdout


def test_help_imports_neither_torch_nor_hydra():
    code = ("import sys; from nvfp4stack.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print(sorted(m for m in ('torch', 'hydra', 'vllm', 'omegaconf') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().endswith("[]"), r.stdout + r.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_only_real_keys_and_recipes(command):
    from nvfp4stack.usage import command_help

    c = command_help(command)
    for key in c.keys:
        assert key in GROUPS or field_path(key) is not None, key
    for example in c.examples:
        words = example.split()
        assert words[:2] == ["python", "main.py"] and command in words, example
        assert split_command(words[2:])[0] == command
        check_overrides([w for w in words[2:] if "=" in w and not w.endswith("=PATH")])
