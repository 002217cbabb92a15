"""The trainer on a tiny budget: loss goes down, the manifest says what ran, runs repeat bit for bit,
an interrupted run leaves nothing behind, the cache is reused, and the config is what conf/ says."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvfp4stack.families.registry import train_budget
from nvfp4stack.models.deepseek_v3.tiny import TinyV3Spec, ensure_tiny_v3, ensure_trained_tiny_v3
from nvfp4stack.train.config import TrainConfig
from nvfp4stack.train.loop import lr_at

ROOT = Path(__file__).resolve().parents[2]
# A small model and budget: enough steps for the loss to fall clearly below its random start.
SPEC = TinyV3Spec(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=16,
                  num_hidden_layers=2, n_routed_experts=4, q_lora_rank=32)
BUDGET = TrainConfig(steps=16, batch_size=4, seq_len=32, warmup_steps=2, lr=1e-2, eval_tokens=1024)


def _manifest(d: Path) -> dict:
    return json.loads((d / "train_manifest.json").read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return ensure_tiny_v3(tmp_path_factory.mktemp("v3a"), SPEC, train=BUDGET)


def test_loss_decreases_and_manifest_says_what_ran(trained):
    m = _manifest(trained)
    assert (m["seed"], m["steps"], m["tokens_seen"]) == (0, 16, 16 * 4 * 32)
    assert m["spec"]["vocab_size"] == 512 and m["train"]["steps"] == 16 and m["uniform_ppl"] == 512
    # the random init predicts ~uniformly (held-out ppl near the vocabulary size); 16 steps learn the
    # token frequencies at least (a drop of 0.5 nats: ~40% lower perplexity)
    assert m["initial_heldout_ppl"] > 0.5 * 512
    assert m["final_heldout_loss"] < m["initial_heldout_loss"] - 0.5, m
    assert m["final_train_loss"] < m["first_train_loss"] - 0.5, m
    assert abs(m["heldout_loss_bf16_weights"] - m["final_heldout_loss"]) < 0.05  # bf16 storage costs little
    assert m["wall_s"] > 0 and m["tokens_per_s"] > 0 and m["heldout_tokens_scored"] >= 1024 - 32
    assert (trained / "config.json").exists() and (trained / "tokenizer.json").exists()
    cfg = json.loads((trained / "config.json").read_text())
    assert (cfg["topk_method"], cfg["torch_dtype"] if "torch_dtype" in cfg else cfg["dtype"]) == ("noaux_tc", "bfloat16")


def test_same_seed_same_bytes(trained, tmp_path):
    from safetensors.torch import load_file

    again = ensure_tiny_v3(tmp_path, SPEC, train=BUDGET)
    a, b = load_file(str(trained / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = _manifest(trained), _manifest(again)
    assert ma["loss_curve"] == mb["loss_curve"] and ma["final_heldout_loss"] == mb["final_heldout_loss"]


def test_other_seed_other_weights(trained, tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    other = ensure_tiny_v3(tmp_path, SPEC, train=TrainConfig(**{**BUDGET.key(), "seed": 1}))
    assert torch.equal(torch.rand(4), expected), "training reseeded the caller's torch RNG"
    a, b = load_file(str(trained / "model.safetensors")), load_file(str(other / "model.safetensors"))
    assert not torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])


def test_cached_result_is_reused(trained, monkeypatch):
    import nvfp4stack.models.deepseek_v3.train as models

    monkeypatch.setattr(models, "train_tiny_v3", lambda *a, **k: pytest.fail("trained again"))
    assert ensure_tiny_v3(trained.parent, SPEC, train=BUDGET) == trained
    assert ensure_trained_tiny_v3(trained.parent, SPEC, BUDGET) == (trained, False)  # what `train` reports


def test_interrupted_run_leaves_nothing(tmp_path, monkeypatch):
    import nvfp4stack.models.deepseek_v3.train as models

    real = models.train_loop

    def interrupted(model, streams, cfg, desc, on_step=None):
        def stop(step, loss):
            if step == 2:
                raise KeyboardInterrupt
        return real(model, streams, cfg, desc, on_step=stop)

    monkeypatch.setattr(models, "train_loop", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_tiny_v3(tmp_path, SPEC, train=BUDGET)
    assert list(tmp_path.iterdir()) == [], "a half-trained model or its temp dir was left behind"


def test_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


def test_split_is_by_text_disjoint_and_seeded():
    from nvfp4stack.corpus import training_texts
    from nvfp4stack.train.data import split_texts

    texts = training_texts()
    train, held = split_texts(texts, TrainConfig())
    assert len(train) + len(held) == len(texts) and not set(train) & set(held)
    assert len(held) == round(0.05 * len(texts))
    assert split_texts(texts, TrainConfig()) == (train, held)
    assert split_texts(texts, TrainConfig(seed=1))[1] != held


def test_conf_default_is_the_dataclass_default():
    """`serve` trains with TrainConfig() and `python main.py train` with conf/train/default.yaml: one
    cache entry only if they agree."""
    from nvfp4stack.cli import compose_config

    assert compose_config("command=train", "run_dir=/tmp/unused").train == TrainConfig()
    assert TrainConfig().resolved("tiny_v3").steps == train_budget("tiny_v3")[0] == 600


def test_train_keys_given_to_another_command_are_named_as_ignored(capsys):
    from nvfp4stack.cli import compose_config
    from nvfp4stack.train.config import warn_unused_train

    warn_unused_train(compose_config("command=serve", "train.steps=5", "train.lr=0.01", "run_dir=/tmp/unused"))
    err = capsys.readouterr().err
    assert "train.steps, train.lr ignored: only `python main.py train` reads train.*" in err, err
    for args in (("command=train", "train.steps=5"), ("command=serve",)):
        warn_unused_train(compose_config(*args, "run_dir=/tmp/unused"))
        assert capsys.readouterr().err == "", args


def test_train_command_says_whether_it_trained(trained, tmp_path, monkeypatch, capsys):
    """`train` on a cached entry reports it cached (from the cache function, not file times) and copies
    the manifest into the run directory."""
    from nvfp4stack.cli import compose_config
    from nvfp4stack.tasks import train as task

    monkeypatch.setattr(task, "trained_dir", lambda cfg: (trained, False))
    assert task.run(compose_config("command=train", f"run_dir={tmp_path}")) == 0
    assert f"train: cached, {trained}" in capsys.readouterr().out
    assert (tmp_path / "train_manifest.json").read_text() == (trained / "train_manifest.json").read_text()


@pytest.mark.parametrize("key,value,match", [
    ("steps", 0, r"train.steps=0: expected > 0"),
    ("heldout_fraction", 0.0, r"train.heldout_fraction=0.0: expected in \(0, 0.5\)"),
    ("dtype", "float16", r"train.dtype='float16' is not valid; expected one of: float32, bfloat16"),
    ("min_lr_ratio", 2.0, r"train.min_lr_ratio=2.0: expected within \[0, 1\]"),
])
def test_bad_values_name_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{key: value})


def test_cli_refuses_a_model_it_cannot_train(tmp_path):
    p = subprocess.run([sys.executable, "main.py", "train", "model=dsv4_pro", f"run_dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "train: model.factory=None" in p.stderr and "tiny_v3" in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
def test_cli_trains_the_recipe_model(tmp_path):
    """`python main.py train` with a tiny budget on the real tiny_v3 spec, in a scratch cache."""
    cmd = [sys.executable, "main.py", "train", "train.steps=2", "train.batch_size=2", "train.seq_len=32",
           "train.eval_tokens=256", f"cache_dir={tmp_path / 'cache'}", f"run_dir={tmp_path / 'run'}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    m = json.loads((tmp_path / "run" / "train_manifest.json").read_text())
    assert (m["model"], m["steps"], m["spec"]["vocab_size"]) == ("tiny_v3", 2, TinyV3Spec().vocab_size)
    out = [d for d in (tmp_path / "cache" / "tiny_v3").iterdir()]
    assert [d.name.startswith("trained-") for d in out] == [True], out  # not the default's bf16/
    assert "held-out loss" in p.stdout and "perplexity" in p.stdout


@pytest.mark.slow
def test_tiny_dsv4_trains_into_the_factory_layouts(root):
    """Two steps on the session's random tiny DeepSeek-V4: trained tensors move, routed experts stay on
    the MXFP4 grid (so the release cast stays lossless), MTP stays as built, all three layouts load."""
    from safetensors.torch import load_file

    from nvfp4stack.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4
    from nvfp4stack.models.deepseek_v4.train import train_tiny_dsv4

    cfg = TrainConfig(steps=2, batch_size=2, seq_len=32, warmup_steps=1, eval_tokens=128)
    out = train_tiny_dsv4(root.parent, cfg)
    assert out.name.startswith(root.name + "-trained-")
    before = load_file(str(root / "bf16" / "model.safetensors"))
    after = load_file(str(out / "bf16" / "model.safetensors"))
    assert before.keys() == after.keys() and all(before[k].dtype == after[k].dtype for k in before)
    assert not torch.equal(before["embed.weight"], after["embed.weight"])
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("mtp."))
    w = after["layers.1.ffn.experts.0.w1.weight"]
    assert not torch.equal(w, before["layers.1.ffn.experts.0.w1.weight"])
    q = quantize_mxfp4(w, name="w1")
    assert torch.equal(dequantize_mxfp4(q.data, q.scale, torch.bfloat16), w), "expert left the MXFP4 grid"
    assert all((out / layout / "config.json").exists() for layout in ("bf16", "release", "hf"))
    m = _manifest(out)
    assert (m["model"], m["steps"], m["stored_as"]) == ("tiny_dsv4", 2, "bf16, routed experts on the MXFP4 grid, MTP as built")
    assert train_tiny_dsv4(root.parent, cfg) == out  # cached
