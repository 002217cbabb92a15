#!/usr/bin/env bash
# One device call: GPU correctness of the MoE kernel (W4A16 and FP8 prefill), then its benchmark.
# Usage (repo root, GPU host): bash bench/tools/device_run.sh [bench args...]
# FORMATS=1 also runs the formats benchmark afterwards.
set -u
OUT=${OUT:-/tmp/moe_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 - <<'PY'
import torch, triton.testing as tt
a = torch.empty(2**30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
ms = tt.do_bench(lambda: b.copy_(a), return_mode="median")
print(f"device copy: {2 * a.numel() / ms / 1e9:.2f} TB/s (read+write)")
# what this torch's FP8 grouped GEMM accepts: row-wise scales, groups not on 16-row boundaries
print("_scaled_grouped_mm:", getattr(torch._scaled_grouped_mm, "__doc__", None) or torch._C._jit_get_schemas_for_operator("aten::_scaled_grouped_mm"))
x = torch.randn(40, 64, device="cuda").to(torch.float8_e4m3fn)
w = torch.randn(2, 32, 64, device="cuda").to(torch.float8_e4m3fn)
for offs in ([16, 40], [13, 40]):
    try:
        y = torch._scaled_grouped_mm(x, w.transpose(1, 2), torch.ones(40, device="cuda"), torch.ones(2, 32, device="cuda"),
                                     offs=torch.tensor(offs, dtype=torch.int32, device="cuda"), out_dtype=torch.bfloat16)
        ref = torch.cat([x[:offs[0]].float() @ w[0].float().T, x[offs[0]:].float() @ w[1].float().T])
        print(f"offs={offs}: ok, rel err {((y.float() - ref).norm() / ref.norm()).item():.1e}")
    except Exception as exc:
        print(f"offs={offs}: {type(exc).__name__}: {str(exc)[:160]}")
PY
timeout 220 python3 -m pytest tests/kernels/moe/test_triton_w4a16.py tests/kernels/moe/test_fp8_prefill.py tests/kernels/test_backend_interface.py \
  tests/formats/test_nvfp4_cuda.py tests/formats/test_mxfp4_nvfp4_fast.py \
  tests/kernels/moe/test_routing.py -q -s -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" \
  | grep -E "rel err|NVFP4->FP8|passed|failed|Error|error" | tail -40
timeout 330 python3 -m nvfp4stack.bench.moe_kernel --out "$OUT/moe_kernel.md" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^  "
if [ "${FORMATS:-0}" = 1 ] && [ -f nvfp4stack/bench/formats.py ]; then
  timeout 120 python3 -m nvfp4stack.bench.formats 2>&1 | tee "$OUT/formats.log" | tail -30
fi
