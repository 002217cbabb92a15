"""cold_l2: the flush reads its buffer (the L2 left clean) unless asked to zero it; on a GPU, it evicts."""
import pytest
import torch

from nvfp4stack.bench.cold_l2 import cold_time_us, evict, flush_buffer, replay_ms


def test_evict_reads_the_buffer_and_leaves_it_as_it_was():
    g = torch.Generator().manual_seed(0)
    buf = torch.randn(4099, generator=g).view(torch.int32)  # the flush buffer is int32; it is summed as float32
    before = buf.clone()
    sink = torch.zeros((), dtype=torch.float32)
    evict(buf, sink)
    assert torch.equal(buf, before)  # nothing written: the L2 is left clean
    assert torch.allclose(sink, before.view(torch.float32).double().sum().float(), rtol=1e-4)  # every element read


def test_dirty_evict_zeroes_the_buffer():
    buf = torch.arange(1, 1001, dtype=torch.int32)
    sink = torch.full((), 7.0)
    evict(buf, sink, dirty=True)
    assert int(buf.abs().sum()) == 0
    assert float(sink) == 7.0  # the zeroing flush reads nothing


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUDA-graph timing with the L2 flushed")
@pytest.mark.parametrize("dirty", [False, True])
def test_the_flush_evicts_what_a_call_left_in_l2(dirty):
    """A read of half the L2's size takes longer after either flush than back to back (where it hits the L2 the
    previous replay left), so the flush put the data out of the L2."""
    dev = torch.device("cuda")
    flush = flush_buffer(dev)
    data = torch.ones(torch.cuda.get_device_properties(dev).L2_cache_size // 8, device=dev)  # float32
    sink = torch.zeros((), device=dev)

    def read():
        torch.sum(data, 0, out=sink)

    cold = cold_time_us(read, flush, dirty=dirty)
    read()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            read()
    warm = replay_ms(g) / 20 * 1e3
    assert float(sink) == data.numel()
    assert cold > 1.25 * warm, f"cold {cold:.2f} us, warm {warm:.2f} us: the flush did not evict the data"
