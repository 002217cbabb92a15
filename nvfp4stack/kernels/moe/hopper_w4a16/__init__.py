"""nvfp4stack's own NVFP4 MoE kernel and its pure-torch twin (no registry code here).

- fused_moe.py: the fused W4A16 expert MLP (Triton; Gluon decode kernels on sm90), tile heuristics
- fp8_prefill.py: its FP8 tensor-core prefill mode (FP8 copy of the experts built at load)
- routing.py / routing_triton.py: slots sorted by expert and padded to a tile (torch / one launch)
- warmup.py: compiles every binary a forward can launch, at load
- torch_twin.py: the same MLP in fp32 torch on any device, the oracle of the kernels above
- packed.py: ``PackedExperts``, what the ``torch_emulation`` and ``triton_w4a16`` backends prepare
- tiles.py: the tile-contiguous layout of the packed expert bytes that triton_w4a16 prepares on sm90
The backends themselves are ../torch_emulation.py and ../triton_w4a16.py.
"""
