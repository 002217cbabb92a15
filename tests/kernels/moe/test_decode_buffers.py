"""decode_buffers: the decode kernels' persistent tile counts and split-K workspace, on the host (CPU tensors
stand in for the device's)."""
import pytest
import torch


def test_split_workspace_counts_are_made_outside_capture(monkeypatch):
    """One zeroed count per tile, made once per device and grown with the outgrown buffer kept alive; the
    placeholder of unsplit tiles made once; a first request inside CUDA-graph capture refused with the fix
    named; the one-token top-k sum's counts are the same buffer."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import decode_buffers as db
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DecodeConfig

    monkeypatch.setattr(db, "_COUNTS", {})
    monkeypatch.setattr(db, "_OUTGROWN", [])
    split, whole = DecodeConfig(8, 1, 256, 8, 0, split_k=2), DecodeConfig(8, 1, 256, 8, 0)
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"split-K decode tiles .* need 192 zeroed tile counters.*inside CUDA-graph "
                                           r"capture.*outside capture first"):
        db.split_workspace(split, 192, cpu)
    with pytest.raises(RuntimeError, match=r"one-token top-k sum \(DecodeConfig\(.*\)\) need 32 zeroed tile counters"):
        db.tile_counters(32, cpu, "the one-token top-k sum", split)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    ws, counts = db.split_workspace(split, 192, cpu)
    assert ws.dtype == torch.float32 and ws.numel() == 192 * 2 * split.rows * split.block_t
    assert counts.dtype == torch.int32 and counts.numel() == 4096 and int(counts.abs().sum()) == 0
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)  # made: capture may use it
    assert db.split_workspace(split, 100, cpu)[1] is counts
    assert db.tile_counters(32, cpu, "the one-token top-k sum", split) is counts
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    grown = db.split_workspace(split, 5000, cpu)[1]
    assert grown.numel() == 5000 and db._OUTGROWN == [counts]
    stub = db.split_workspace(whole, 192, cpu)
    assert stub[0] is stub[1] and stub[0] is db.split_workspace(whole, 10, cpu)[0]
