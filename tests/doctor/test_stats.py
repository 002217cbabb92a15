"""Doctor value checks that need no checkpoint: the gate/up global-scale comparison."""
from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.doctor.stats import check_gate_up_scales


def _warned(s2, pairs=None) -> list[tuple[str, str, str]]:
    report = DoctorReport("ckpt")
    check_gate_up_scales(s2, report, pairs)
    return [(f.check, f.where, f.found) for f in report.warnings]


def test_gate_up_scales_differ_under_the_familys_names():
    s2 = {"m.layers.0.mlp.experts.1.gate_proj": 1.0, "m.layers.0.mlp.experts.1.up_proj": 2.0,
          "layers.0.ffn.experts.1.w1": 1.0, "layers.0.ffn.experts.1.w3": 3.0,
          "layers.0.ffn.experts.2.w1": 1.0, "layers.0.ffn.experts.2.w3": 1.0}
    assert _warned(s2, (("gate_proj", "up_proj"),)) == [
        ("w13_global", "m.layers.0.mlp.experts.1.gate_proj.weight_scale_2", "gate_proj 1 != up_proj 2")]
    assert _warned(s2, (("w1", "w3"),)) == [("w13_global", "layers.0.ffn.experts.1.w1.weight_scale_2", "w1 1 != w3 3")]
    # no family known: every registered family's names
    assert [w for _, w, _ in _warned(s2)] == ["layers.0.ffn.experts.1.w1.weight_scale_2",
                                              "m.layers.0.mlp.experts.1.gate_proj.weight_scale_2"]


def test_gate_up_warning_names_expected_and_fix():
    report = DoctorReport("ckpt")
    check_gate_up_scales({"e.wg": 1.0, "e.wu": 2.0}, report, (("wg", "wu"),))
    (f,) = report.warnings
    assert "one shared weight_scale_2 for wg and wu" in f.expected
    assert "Re-quantize wg/wu" in f.fix and "w13_shared_global_scale" in f.fix
