"""nvfp4stack's own NVFP4 MoE kernel (Triton/Gluon) and its pure-torch twin."""
