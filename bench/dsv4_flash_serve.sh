#!/usr/bin/env bash
# DeepSeek-V4-Flash at full width, synthetic weights (issue #34), one MoE setting per call:
# MOE=marlin (stock vLLM: the release's MXFP4 experts on vLLM's Marlin) or MOE=triton_w4a16 (ours: the
# same MXFP4 weights cast to NVFP4 at load). TP=<GPUs> EP=true|false; LAYERS=<n> cuts the depth
# (unset: all 43 layers). Needs the bundles installed in $SITE (README "Running on an offline GPU host").
# Writes $OUT/<tag>.json (greedy tokens, teacher-forced logprobs, 2k prefill, decode tok/s) and prints
# the ready time and the per-rank memory lines of vLLM's log. CUDA graphs are captured for CAPTURE's
# sizes only (DeepSeek-V4's TileLang kernels compile per captured size: vLLM's 51 default sizes took
# over 7 minutes on a cold H200).
#   MOE=marlin LAYERS=8 bash bench/dsv4_flash_serve.sh
#   MOE=triton_w4a16 TP=2 EP=true BATCHES=1,8,32,128,256 CAPTURE=1,8,32,128,256 bash bench/dsv4_flash_serve.sh
set -uo pipefail
MOE=${MOE:-triton_w4a16}
TP=${TP:-1}
EP=${EP:-false}
LAYERS=${LAYERS:-}
OUT=${OUT:-/tmp/nvfp4stack-out}
RUNS=${RUNS:-$OUT}   # run directories (vLLM log, launch command); the JSON and serve log go to $OUT
PORT=${PORT:-8011}
TAG=${TAG:-$MOE-tp$TP-ep$EP}
mkdir -p "$OUT"
export PYTHONPATH="$(bash nvfp4stack/bundle/gpu_host.sh pythonpath):$PWD"
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/dg-cache} VLLM_DEEP_GEMM_WARMUP=${VLLM_DEEP_GEMM_WARMUP:-skip}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
depth=()
[ -n "$LAYERS" ] && depth=(model.num_layers="$LAYERS")
t0=$(date +%s)
python3 main.py recipe=dsv4_flash_h200 "${depth[@]}" engine.tp="$TP" engine.ep="$EP" \
    engine.speculative.method=null engine.load_format=synthetic engine.tokenizer_mode=hf \
    engine.tool_call_parser=null engine.reasoning_parser=null engine.enable_auto_tool_choice=false \
    engine.max_model_len=4096 engine.gpu_memory_utilization=0.85 engine.port="$PORT" \
    engine.max_num_seqs="${MAX_SEQS:-32}" \
    "engine.compilation_config='{\"cudagraph_capture_sizes\":[${CAPTURE:-1,2,4,8,16,32}]}'" \
    engine.ready_timeout_s="${READY_TIMEOUT_S:-540}" backend.moe="$MOE" "run_dir=$RUNS/$TAG" serve \
    > "$OUT/$TAG.serve.log" 2>&1 &
pid=$!
ready=""
bash nvfp4stack/bundle/gpu_host.sh wait-ready "$OUT/$TAG.serve.log" $pid "${READY_TIMEOUT_S:-540}" && ready=1
echo "$TAG: ready after $(( $(date +%s) - t0 )) s: ${ready:-no}"
rc=1
if [ -n "$ready" ]; then
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
    python3 bench/dsv4_flash_run.py --base-url "http://127.0.0.1:$PORT/v1" --model dsv4_flash \
        --json "$OUT/$TAG.json" --batches "${BATCHES:-1,8,32}" --prefill-tokens "${PREFILL:-2048}" && rc=0
    grep -E "nvfp4stack: |synthetic weights|Model loading took|KV cache memory|KV cache size" \
        "$RUNS/$TAG/vllm_server.log" | cut -c1-220 | head -16
else
    tail -25 "$OUT/$TAG.serve.log"; grep -E "Error|error|Traceback" -A3 "$RUNS/$TAG/vllm_server.log" | tail -60
fi
kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null
exit $rc
