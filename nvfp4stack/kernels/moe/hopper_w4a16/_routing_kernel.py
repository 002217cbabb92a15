"""The routing alignment kernel of routing_triton (imported when it runs: Triton on the host)."""
import triton
import triton.language as tl


@triton.jit
def _region_out(padded, e_ok, num_experts, num_slots, sorted_ptr, max_padded, expert_ids_ptr, max_blocks,
                num_padded_ptr, BM: tl.constexpr, CH: tl.constexpr, FILL: tl.constexpr):
    """One region's slot count, sentinel fill and per-block experts; returns its experts' start slots."""
    padded_end = tl.cumsum(padded, 0)
    tl.store(num_padded_ptr, tl.sum(padded, 0))
    for p0 in range(0, max_padded, FILL):
        offs = p0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + offs, tl.zeros([FILL], dtype=tl.int32) + num_slots, mask=offs < max_padded)
    for b0 in range(0, max_blocks, CH):
        blk = b0 + tl.arange(0, CH)
        start = blk * BM
        ex = tl.sum(((padded_end[None, :] <= start[:, None]) & e_ok[None, :]).to(tl.int32), axis=1)
        ex = tl.where(ex < num_experts, ex, -1)
        tl.store(expert_ids_ptr + blk, ex, mask=blk < max_blocks)
    return padded_end - padded


# per-call sizes are not specialized (one binary per BM): see _triton_kernels._PER_CALL
@triton.jit(do_not_specialize=["num_slots", "max_padded", "max_blocks", "max_padded2", "max_blocks2"])
def align_kernel(
    ids_ptr, num_slots, num_experts,
    sorted_ptr, max_padded, expert_ids_ptr, max_blocks, num_padded_ptr,
    sorted2_ptr, max_padded2, expert_ids2_ptr, max_blocks2, num_padded2_ptr,
    EP2: tl.constexpr, BM: tl.constexpr, CH: tl.constexpr, FILL: tl.constexpr,
    SPLIT: tl.constexpr, BM2: tl.constexpr,
):
    """SPLIT == 0: every expert in BM-slot blocks (outputs 2 unused). SPLIT > 0: experts with at most
    SPLIT slots in BM-slot blocks (outputs 1), the others in BM2-slot blocks (outputs 2)."""
    e_idx = tl.arange(0, EP2)
    e_ok = e_idx < num_experts
    counts = tl.zeros([EP2], dtype=tl.int32)
    for c0 in range(0, num_slots, CH):
        offs = c0 + tl.arange(0, CH)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == e_idx[None, :]).to(tl.int32), axis=0)
    if SPLIT:
        small = counts <= SPLIT
    else:
        small = counts >= 0
    run = _region_out(tl.where(small, (counts + BM - 1) // BM * BM, 0), e_ok, num_experts, num_slots, sorted_ptr,
                      max_padded, expert_ids_ptr, max_blocks, num_padded_ptr, BM, CH, FILL)
    if SPLIT:
        run2 = _region_out(tl.where(small, 0, (counts + BM2 - 1) // BM2 * BM2), e_ok, num_experts, num_slots,
                           sorted2_ptr, max_padded2, expert_ids2_ptr, max_blocks2, num_padded2_ptr, BM2, CH, FILL)
        run = tl.where(small, run, run2)
    tl.debug_barrier()  # the sentinel fill above must land before the scatter below
    for c0 in range(0, num_slots, CH):
        offs = c0 + tl.arange(0, CH)
        m = offs < num_slots
        ids = tl.load(ids_ptr + offs, mask=m, other=-1).to(tl.int32)
        onehot = (ids[:, None] == e_idx[None, :]).to(tl.int32)
        incl = tl.cumsum(onehot, 0)
        dest = tl.sum(onehot * (incl - 1 + run[None, :]), axis=1)
        if SPLIT:
            to_small = tl.sum(onehot * small.to(tl.int32)[None, :], axis=1) > 0
            tl.store(sorted_ptr + dest, offs, mask=m & to_small)
            tl.store(sorted2_ptr + dest, offs, mask=m & (ids >= 0) & ~to_small)
        else:
            tl.store(sorted_ptr + dest, offs, mask=m)
        run += tl.sum(onehot, axis=0)
