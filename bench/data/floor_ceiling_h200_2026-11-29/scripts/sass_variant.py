"""CPU host: decode_sass's one-token rows with a diagnostic dequant variant applied (argv[1])."""
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "scratch/floor")
import deq_variants

deq_variants.apply(sys.argv[1])
sys.path.insert(0, "bench/tools")
import decode_sass

for r in decode_sass.rows(True, 8):
    if r[0] == "one token":
        print(sys.argv[1], r[1], r[2], "regs", r[3], "loop", r[4], "words", r[5], f"/word {r[6]:.1f}", r[7], "|", r[8])
