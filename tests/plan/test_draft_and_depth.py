"""The plan's per-GPU figures follow what vLLM loads and caches (issue #34, measured on one H200 on
2026-11-27: DeepSeek-V4-Flash cut to 8 layers, no MTP draft, loaded 30.92 GiB and cached ~1.7M tokens):
without an MTP draft vLLM's main model drops the MTP tensors, so they take no GPU bytes; a model cut to
``model.num_layers`` caches only those layers."""
from nvfp4stack.cli import compose_config
from nvfp4stack.plan.build import kv_cache_for_config, plan_for_config

FLASH8 = ("recipe=dsv4_flash_h200", "model.num_layers=8", "engine.tp=1", "engine.ep=false", "engine.max_model_len=4096",
          "engine.gpu_memory_utilization=0.85")


def test_mtp_tensors_take_gpu_bytes_only_with_the_mtp_draft(tmp_path):
    run = f"run_dir={tmp_path}"
    with_draft = plan_for_config(compose_config(*FLASH8, run))
    without = plan_for_config(compose_config(*FLASH8, run, "engine.speculative.method=null"))
    mtp = [g for g in with_draft.groups if g.mtp]
    assert mtp and sum(g.gpu_bytes for g in mtp) > 3e9                  # the Flash MTP block: ~3.6 GB
    assert all(g.gpu_bytes == 0 for g in without.groups if g.mtp)
    assert with_draft.gpu_bytes - without.gpu_bytes == sum(g.gpu_bytes for g in mtp)
    # stored bytes (what convert writes) do not depend on serving
    assert with_draft.total_bytes == without.total_bytes
    # the 2026-11-27 measurement: 30.92 GiB loaded by ours; the plan within 5%
    assert abs(without.gpu_bytes / 2**30 - 30.92) / 30.92 < 0.05
    assert abs(with_draft.gpu_bytes / 2**30 - 30.92) / 30.92 > 0.05      # counting the draft missed by 8%


def test_kv_cache_counts_only_the_layers_kept(tmp_path):
    cfg = compose_config(*FLASH8, f"run_dir={tmp_path}", "engine.speculative.method=null")
    kv = kv_cache_for_config(cfg, plan_for_config(cfg))
    swa = next(c for c in kv["caches"] if c["cache"].startswith("swa"))
    assert swa["layers"] == 8
    assert sum(c["layers"] for c in kv["caches"] if c["cache"].startswith("compressed kv")) < 8
    full = compose_config("recipe=dsv4_flash_h200", "engine.tp=1", "engine.ep=false", "engine.max_model_len=4096",
                          "engine.speculative.method=null", f"run_dir={tmp_path}")
    full_kv = kv_cache_for_config(full, plan_for_config(full))
    assert next(c for c in full_kv["caches"] if c["cache"].startswith("swa"))["layers"] == 43
