"""``plan`` prints bytes and parameter counts in units that show them, tiny models included (#12)."""
from nvfp4stack.tasks.plan import _fmt_bytes, _fmt_params


def test_units_scale_with_the_size():
    assert _fmt_bytes(913.03e9) == "913.03 GB"
    assert _fmt_bytes(0.1e9) == "0.10 GB"
    assert _fmt_bytes(3.38 * 2**20) == "3.38 MiB"
    assert _fmt_bytes(9.5 * 2**10) == "9.50 KiB"
    assert _fmt_params(1_598_815_683_358) == "1.599T"
    assert _fmt_params(15_381_228) == "15.381M"
    assert _fmt_params(640) == "0.6K"


def test_tiny_plan_shows_no_zero_gigabytes(tmp_path, capsys):
    from nvfp4stack.cli import compose_config
    from nvfp4stack.tasks.plan import run

    cfg = compose_config("recipe=tiny_dsv4", "model.source_format=official", f"run_dir={tmp_path}")
    assert run(cfg) == 0
    out = capsys.readouterr().out
    assert "0.00 GB" not in out and "MiB" in out
    by_role = next(line for line in out.splitlines() if line.startswith("bytes by role: "))
    assert "routed_experts" in by_role and " GB" not in by_role
    # the untouched MXFP4 MTP experts run on the CPU emulation
    mtp_row = next(line for line in out.splitlines() if line.startswith("routed_experts") and " yes " in line)
    assert "mxfp4 -> mxfp4" in mtp_row and "torch_emulation" in mtp_row


def test_passthrough_experts_scheme_comes_from_the_family():
    from nvfp4stack.cli import compose_config
    from nvfp4stack.plan.build import plan_for_config
    from nvfp4stack.schemes import Scheme
    from nvfp4stack.tasks.plan import expert_scheme

    def scheme(*args):
        return expert_scheme(plan_for_config(compose_config(*args, "precision.routed_experts=passthrough",
                                                            "run_dir=/tmp/unused")))

    assert scheme("recipe=tiny_dsv4", "model.source_format=official") is Scheme.MXFP4   # DeepSeek-V4's release
    assert scheme("recipe=dsv4_h200", "model.source_format=modelopt") is Scheme.NVFP4   # weight-free descriptor
    assert scheme("recipe=qwen3_235b_h200", "model.source_format=modelopt") is Scheme.NVFP4
    assert scheme("recipe=qwen3_235b_h200", "model.source_format=bf16") is Scheme.BF16
    assert scheme("recipe=tiny_dsv4") is Scheme.BF16
    assert scheme("recipe=tiny_cpu") is Scheme.BF16                                       # DeepseekV3: generic
