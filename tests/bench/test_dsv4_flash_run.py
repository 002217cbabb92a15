"""bench/dsv4_flash_run.py's comparison of two serve runs (issue #34): greedy equal prefixes and the
teacher-forced agreement, on runs that part at known places."""
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "dsv4_flash_run.py"


def _module():
    spec = importlib.util.spec_from_file_location("dsv4_flash_run", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(greedy, own, top1):
    return {"greedy": [{"prompt_len": n, "token_ids": t, "tokens": None, "logprobs": [lp] + [0.0] * (len(t) - 1)}
                       for n, t, lp in greedy],
            "teacher_forced": [{"prompt_len": 8, "own_logprob": own, "top1": top1}]}


def test_compare_reports_where_runs_part_and_how_far(tmp_path, capsys):
    a = _run([(1, [5, 6, 7, 8], -1.25), (4, [9, 9, 9], -0.5)], [-1.0, -2.0, -3.0, -4.0], [11, 12, 13, 14])
    b = _run([(1, [5, 6, 0, 8], -1.5), (4, [9, 9, 9], -0.5)], [-1.0, -2.5, -3.0, -3.75], [11, 12, 99, 14])
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert _module().compare(str(tmp_path / "a.json"), str(tmp_path / "b.json")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "greedy len    1: equal prefix  2 of 4; first-token logprob -1.250 vs -1.500"
    assert lines[1].startswith("greedy len    4: equal prefix  3 of 3")
    assert lines[2] == ("teacher-forced, 4 positions: top-1 token equal at 3 (75.0%); |delta logprob| of the "
                        "prompt's own token: median 0.1250, p90 0.2500, max 0.5000 nats")


def test_prompts_are_fixed_and_inside_the_token_range():
    mod = _module()
    p = mod.prompts()
    assert [len(x) for x in p] == list(mod.PROMPT_LENGTHS) and p == mod.prompts()
    assert all(300 <= t < mod.TOKEN_HI for x in p for t in x) and len({t for x in p for t in x}) > 100


def test_compare_reports_the_reference_margin_where_top1_differs(tmp_path, capsys):
    """Runs with top-2 margins (prompt_logprobs=2): the first run's margin, overall and where the two runs'
    top-1 tokens differ, so a flip can be read against how close the runner-up was."""
    a = _run([(1, [5], -1.0)], [-1.0, -2.0, -3.0, -4.0], [11, 12, 13, 14])
    b = _run([(1, [5], -1.0)], [-1.0, -2.0, -3.0, -4.0], [11, 99, 13, 98])
    a["teacher_forced"][0]["margin"] = [2.0, 0.125, 1.0, 0.5]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    _module().compare(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == ("first run's top-1 margin over the runner-up: median 0.7500 nats over 4 positions; where the "
                    "top-1 tokens differ: median 0.3125, max 0.5000 nats (2 positions)")
