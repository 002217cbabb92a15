"""The doctor's report: a skipped check is never 'clean', follow-on errors are one row under their
root cause, and many findings alike but for numbers are one counted row (every finding stays in JSON)."""
from nvfp4stack.doctor.report import DoctorReport


def _missing(report: DoctorReport, names) -> None:
    for n in names:
        report.error("missing", n, "absent", "F32 []", "re-convert")


def test_skipped_check_is_not_clean_but_exits_zero():
    r = DoctorReport("ckpt")
    r.skip("vllm_load", "vLLM is not installed here")
    out = r.table()
    assert r.exit_code == 0
    assert "SKIPPED vllm_load: vLLM is not installed here" in out
    assert out.splitlines()[-1].startswith("result: no errors, not clean: 1 check(s) skipped (vllm_load)")
    assert "clean (" not in out.splitlines()[-1]
    j = r.to_json()
    assert j["ok"] and not j["clean"] and j["skipped"] == {"vllm_load": "vLLM is not installed here"}


def test_clean_only_without_errors_and_skips():
    r = DoctorReport("ckpt")
    assert r.table().splitlines()[-1] == "result: clean (0 errors, 0 warnings)"
    r.error("x", "t", "a", "b", "c")
    r.skip("vllm_load", "off")
    assert r.table().splitlines()[-1] == "result: FAILED (1 errors, 0 warnings)" and r.exit_code == 1


def test_follow_on_errors_are_counted_under_their_root():
    r = DoctorReport("ckpt")
    lost = [f"layers.{i}.attn.wq_a.weight" for i in range(40)]
    r.error("truncated", "model-00002.safetensors", "40 tensors past the end", "all bytes", "re-copy it")
    r.lose(lost, "model-00002.safetensors")
    _missing(r, lost)
    r.error("config", "config.json:topk_method", "None", "'noaux_tc'", "set it")   # unrelated: its own row
    out = r.table(full_list="/run/doctor.json")
    rows = [ln for ln in out.splitlines() if ln.startswith("  ") and "|" in ln][1:]
    assert len(rows) == 3, out
    assert rows[0].split("|")[0].strip() == "truncated"
    assert "40 follow-on errors of model-00002.safetensors" in rows[1]
    assert "missing for 40 tensors of model-00002.safetensors (e.g. layers.0.attn.wq_a.weight" in rows[1]
    assert "/run/doctor.json" in rows[1]
    assert rows[2].split("|")[0].strip() == "config"
    assert len(r.errors) == 42 and r.exit_code == 1
    causes = [e["cause"] for e in r.to_json()["errors"]]
    assert causes.count("model-00002.safetensors") == 40


def test_findings_alike_but_for_numbers_are_one_counted_row():
    r = DoctorReport("ckpt")
    names = [f"layers.{l}.ffn.experts.{e}.w{w}.input_scale" for l in range(2) for e in range(4) for w in (1, 3)]
    _missing(r, names)
    _missing(r, ["layers.0.attn.wkv.weight"])
    rows = [ln for ln in r.table().splitlines() if ln.startswith("  ") and "|" in ln][1:]
    assert len(rows) == 2
    assert "layers.N.ffn.experts.N.wN.input_scale (x16)" in rows[0]
    assert f"at {names[0]}; 15 more alike" in rows[0]
    assert "layers.0.attn.wkv.weight" in rows[1]
    assert len(r.to_json()["errors"]) == 17
