"""The routing alignment kernel of routing_triton (imported when it runs: Triton on the host)."""
import triton
import triton.language as tl


@triton.jit
def _expert_run(ids_ptr, num_slots, e, count, start, padded, sorted_ptr, expert_ids_ptr,
                BM: tl.constexpr, CH: tl.constexpr):
    """Expert e's slots in token-major order at [start, start + count), the sentinel up to its padded
    end, and its blocks' expert id."""
    run = start
    for c0 in range(0, num_slots, CH):
        offs = c0 + tl.arange(0, CH)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1).to(tl.int32)
        hit = ids == e
        incl = tl.cumsum(hit.to(tl.int32), 0)
        tl.store(sorted_ptr + run + incl - 1, offs, mask=hit)
        run += tl.sum(hit.to(tl.int32), 0)
    pad = start + count + tl.arange(0, BM)
    tl.store(sorted_ptr + pad, tl.zeros([BM], dtype=tl.int32) + num_slots, mask=pad < start + padded)
    for b0 in range(start // BM, (start + padded) // BM, CH):
        blk = b0 + tl.arange(0, CH)
        tl.store(expert_ids_ptr + blk, tl.zeros([CH], dtype=tl.int32) + e, mask=blk < (start + padded) // BM)


@triton.jit
def _region_tail(total, num_slots, sorted_ptr, max_padded, expert_ids_ptr, max_blocks, num_padded_ptr,
                 BM: tl.constexpr, FILL: tl.constexpr):
    """A region's slot count, and the sentinel / -1 past its last expert's run."""
    tl.store(num_padded_ptr, total)
    for p0 in range(total, max_padded, FILL):
        offs = p0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + offs, tl.zeros([FILL], dtype=tl.int32) + num_slots, mask=offs < max_padded)
    for b0 in range(total // BM, max_blocks, FILL):
        blk = b0 + tl.arange(0, FILL)
        tl.store(expert_ids_ptr + blk, tl.zeros([FILL], dtype=tl.int32) - 1, mask=blk < max_blocks)


# per-call sizes are not specialized (one binary per BM): see _triton_kernels._PER_CALL
@triton.jit(do_not_specialize=["num_slots", "max_padded", "max_blocks", "max_padded2", "max_blocks2"])
def align_kernel(
    ids_ptr, num_slots, num_experts,
    sorted_ptr, max_padded, expert_ids_ptr, max_blocks, num_padded_ptr,
    sorted2_ptr, max_padded2, expert_ids2_ptr, max_blocks2, num_padded2_ptr,
    EP2: tl.constexpr, BM: tl.constexpr, CH: tl.constexpr, FILL: tl.constexpr,
    SPLIT: tl.constexpr, BM2: tl.constexpr,
):
    """Grid: num_experts + 1 programs. Program e < num_experts writes expert e's run (its slots, padding
    and blocks); the last program writes what lies past the last run, and the slot counts. Every
    program counts all slots per expert itself (a histogram: no program waits for another).

    SPLIT == 0: every expert in BM-slot blocks (outputs 2 unused). SPLIT > 0: experts with at most
    SPLIT slots in BM-slot blocks (outputs 1), the others in BM2-slot blocks (outputs 2)."""
    pid = tl.program_id(0)
    e_idx = tl.arange(0, EP2)
    counts = tl.zeros([EP2], dtype=tl.int32)
    for c0 in range(0, num_slots, CH):
        offs = c0 + tl.arange(0, CH)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1).to(tl.int32)
        counts += tl.histogram(ids, EP2, mask=ids >= 0)  # negative ids: another rank's experts, dropped
    if SPLIT:
        small = counts <= SPLIT
    else:
        small = counts >= 0
    valid = e_idx < num_experts
    padded = tl.where(small & valid, (counts + BM - 1) // BM * BM, 0)
    padded2 = tl.where(small | ~valid, 0, (counts + BM2 - 1) // BM2 * BM2)  # zeros unless SPLIT
    end = tl.cumsum(padded, 0)
    end2 = tl.cumsum(padded2, 0)
    if pid < num_experts:
        mine = e_idx == pid
        count = tl.sum(tl.where(mine, counts, 0), 0)
        p = tl.sum(tl.where(mine, padded, 0), 0)
        p2 = tl.sum(tl.where(mine, padded2, 0), 0)
        if p2 > 0:  # a busy expert (SPLIT)
            _expert_run(ids_ptr, num_slots, pid, count, tl.sum(tl.where(mine, end2, 0), 0) - p2, p2, sorted2_ptr,
                        expert_ids2_ptr, BM2, CH)
        elif p > 0:
            _expert_run(ids_ptr, num_slots, pid, count, tl.sum(tl.where(mine, end, 0), 0) - p, p, sorted_ptr,
                        expert_ids_ptr, BM, CH)
    else:
        _region_tail(tl.sum(padded, 0), num_slots, sorted_ptr, max_padded, expert_ids_ptr, max_blocks,
                     num_padded_ptr, BM, FILL)
        if SPLIT:
            _region_tail(tl.sum(padded2, 0), num_slots, sorted2_ptr, max_padded2, expert_ids2_ptr, max_blocks2,
                         num_padded2_ptr, BM2, FILL)
