#!/usr/bin/env bash
# DeepSeek-V4-Flash at full width, synthetic weights (issue #34), one MoE setting per server:
# MOE=marlin (stock vLLM: the release's MXFP4 experts on vLLM's Marlin) or MOE=triton_w4a16 (ours: the
# same MXFP4 weights cast to NVFP4 at load). TP=<GPUs> EP=true|false; LAYERS=<n> cuts the depth
# (unset: all 43 layers); MTP=true keeps the recipe's MTP draft. Needs the bundles installed in $SITE
# (README "Running on an offline GPU host"). CUDA graphs are captured for CAPTURE's sizes only
# (DeepSeek-V4's TileLang kernels compile per captured size: vLLM's 51 default sizes took over 7 minutes
# on a cold H200). CACHE=<dir> gives the server its own compile caches (TileLang, DeepGEMM, Triton,
# vLLM's torch.compile), so two servers started side by side each start cold and never race; DG_CACHE=<dir>
# shares DeepGEMM's cache between servers whose attention linears are the same. EAGER=true
# runs without CUDA graphs (MOE=torch_emulation, the fp32 reference MoE, syncs with the host).
#
# ACTION (default all = start, wait, measure, stop):
#   start    launches `main.py serve` in its own process session (outlives the device call), returns
#   wait     waits for "engine ready", prints the ready time (from start), the memory lines of vLLM's log
#   measure  one client run (bench/dsv4_flash_run.py) into $OUT/<tag><ROUND>.json; it lists the kernels DeepGEMM,
#            Triton and TileLang compiled while it ran and marks a cell whose timed rounds saw one
#   profile  one 2k-token prefill inside vLLM's torch profiler; every rank's kernel-time table (vLLM 0.26
#            writes profiler_out_<rank>.txt) printed. Needs PROFILE_DIR=<dir>, which start turns into --profiler-config
#   stop     Ctrl-C to the server, waits for it to end
#   MOE=marlin LAYERS=8 bash bench/dsv4_flash_serve.sh
#   MOE=triton_w4a16 TP=2 EP=true BATCHES=1,8,32,128,256 CAPTURE=1,8,32,128,256 bash bench/dsv4_flash_serve.sh
#   CUDA_VISIBLE_DEVICES=2,3 PORT=8012 MOE=marlin TP=2 ACTION=start bash bench/dsv4_flash_serve.sh
set -uo pipefail
MOE=${MOE:-triton_w4a16}
TP=${TP:-1}
EP=${EP:-false}
MTP=${MTP:-false}
LAYERS=${LAYERS:-}
ACTION=${ACTION:-all}
OUT=${OUT:-/tmp/nvfp4stack-out}
RUNS=${RUNS:-$OUT}   # run directories (vLLM log, launch command, pid); the JSON and serve log go to $OUT
PORT=${PORT:-8011}
TAG=${TAG:-$MOE-tp$TP-ep$EP}
# a cold start at full depth took 583-606 s on H200s (2026-11-26/27), before the plugin's mHC warm-up (about 38
# TileLang compiles, some 8 more minutes on a fresh host; nvfp4stack/models/deepseek_v4/mhc_warmup.py)
READY_TIMEOUT_S=${READY_TIMEOUT_S:-1500}
mkdir -p "$OUT" "$RUNS"
export PYTHONPATH="$(bash nvfp4stack/bundle/gpu_host.sh pythonpath):$PWD"
if [ -n "${CACHE:-}" ]; then
    export TILELANG_CACHE_DIR="${TL_CACHE:-$CACHE/tilelang}" DG_JIT_CACHE_DIR="${DG_CACHE:-$CACHE/dg}" TRITON_CACHE_DIR="$CACHE/triton" \
        VLLM_CACHE_ROOT="$CACHE/vllm"
fi
# vLLM's default DeepGEMM warm-up (relax; its compiles spread over processes by the plugin, about 1.5 minutes at
# TP=2 on H200s, nvfp4stack/engine/deepgemm_warmup.py): with "skip" the JIT moves into serving, and the 2026-11-26
# four-H200 run saw decode rounds at batch 128/256 stall for minutes (104 to 9,624 tok/s in one cell).
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/dg-cache} VLLM_DEEP_GEMM_WARMUP=${VLLM_DEEP_GEMM_WARMUP:-relax}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
pidfile="$RUNS/$TAG.pid"

start() {
    local depth=() mtp=(engine.speculative.method=null) prof=()
    [ -n "$LAYERS" ] && depth=(model.num_layers="$LAYERS")
    # vLLM's torch profiler, idle until ACTION=profile: each rank's kernel table goes to $PROFILE_DIR
    if [ -n "${PROFILE_DIR:-}" ]; then
        case $PROFILE_DIR in   # it goes into a quoted Hydra list element
            *[\'\\\$\{\}\ ,]*) echo "dsv4_flash_serve.sh: PROFILE_DIR=$PROFILE_DIR: expected a path without quotes, backslashes, \$, braces, spaces or commas; pick another directory" >&2; return 2 ;;
        esac
        mkdir -p "$PROFILE_DIR" && rm -f "$PROFILE_DIR"/*profiler_out*.txt   # profile prints this server's tables only
        prof=("engine.extra_args=['--profiler-config.profiler=torch','--profiler-config.torch_profiler_dir=$PROFILE_DIR','--profiler-config.torch_profiler_with_stack=false']")
    fi
    [ "$MTP" = true ] && mtp=()
    date +%s > "$RUNS/$TAG.t0"
    setsid python3 main.py recipe=dsv4_flash_h200 "${depth[@]}" engine.tp="$TP" engine.ep="$EP" "${mtp[@]}" \
        engine.load_format=synthetic engine.tokenizer_mode=hf \
        engine.tool_call_parser=null engine.reasoning_parser=null engine.enable_auto_tool_choice=false \
        engine.max_model_len=4096 engine.gpu_memory_utilization="${GPU_UTIL:-0.85}" engine.port="$PORT" \
        engine.max_num_seqs="${MAX_SEQS:-32}" \
        "engine.compilation_config='{\"cudagraph_capture_sizes\":[${CAPTURE:-1,2,4,8,16,32}]}'" engine.cudagraph_batches=null \
        engine.ready_timeout_s="$READY_TIMEOUT_S" engine.enforce_eager="${EAGER:-false}" backend.moe="$MOE" \
        "${prof[@]}" "run_dir=$RUNS/$TAG" serve \
        > "$OUT/$TAG.serve.log" 2>&1 < /dev/null &
    echo $! > "$pidfile"
    echo "$TAG: started (pid $!, port $PORT, GPUs ${CUDA_VISIBLE_DEVICES:-all})"
}

wait_ready() {
    local pid t0 rc=1
    pid=$(cat "$pidfile") t0=$(cat "$RUNS/$TAG.t0")
    bash nvfp4stack/bundle/gpu_host.sh wait-ready "$OUT/$TAG.serve.log" "$pid" "$READY_TIMEOUT_S" && rc=0
    echo "$TAG: ready after $(( $(date +%s) - t0 )) s: $([ $rc = 0 ] && echo yes || echo no)"
    if [ $rc = 0 ]; then
        # per rank: weights, the KV pool, and what vLLM's memory profile kept back (CUDA graphs, activations)
        grep -E "nvfp4stack: |synthetic weights|Model loading took|KV cache memory|KV cache size|Maximum concurrency|CUDA graph memory profiling is enabled|CUDA graph pool memory" \
            "$RUNS/$TAG/vllm_server.log" | grep -v -e "tile layout" -e " -> Nvfp4Stack" | cut -c1-330 | head -30
    else
        tail -25 "$OUT/$TAG.serve.log"; grep -E "Error|error|Traceback" -A3 "$RUNS/$TAG/vllm_server.log" | tail -60
    fi
    return $rc
}

measure() {
    # the draft under CUDA graphs: vLLM 0.26 scores prompts from a buffer the draft's graph reuses (vllm#53488)
    local SKIP_SCORING=()
    [ "$MTP" = true ] && [ "${EAGER:-false}" != true ] && SKIP_SCORING=(--skip-teacher-forced
        "MTP draft with CUDA graphs: vLLM 0.26 returns wrong prompt_logprobs (vllm-project/vllm#53488)")
    python3 bench/dsv4_flash_run.py --base-url "http://127.0.0.1:$PORT/v1" --model dsv4_flash \
        --json "$OUT/$TAG${ROUND:-}.json" --batches "${BATCHES:-1,8,32}" --prefill-tokens "${PREFILL:-2048}" \
        --rounds "${ROUNDS:-3}" ${GREEDY:+--greedy-tokens "$GREEDY"} "${SKIP_SCORING[@]}" \
        --compile-dirs "$DG_JIT_CACHE_DIR/cache,${TRITON_CACHE_DIR:-$HOME/.triton/cache},${TILELANG_CACHE_DIR:-$HOME/.tilelang/cache}/*/kernels"
}

profile() {   # one 2k-token prefill (PREFILL) under vLLM's profiler: needs PROFILE_DIR at start too
    [ -n "${PROFILE_DIR:-}" ] || { echo "dsv4_flash_serve.sh: ACTION=profile needs PROFILE_DIR (also at start)" >&2; return 2; }
    python3 bench/dsv4_flash_run.py profile "http://127.0.0.1:$PORT/v1" dsv4_flash "${PREFILL:-2048}" || return 1
    local f n=0
    for f in "$PROFILE_DIR"/*profiler_out*.txt; do   # vLLM 0.26: profiler_out_<rank>.txt; later: <worker>.profiler_out.txt
        [ -f "$f" ] && [ "$(wc -c < "$f")" -gt 1 ] || continue   # (the API server's own table is empty)
        echo "== $TAG $(basename "$f")"; head -"${PROFILE_ROWS:-30}" "$f" | cut -c1-240
        n=$(( n + 1 ))
    done
    [ "$n" -gt 0 ] || { echo "dsv4_flash_serve.sh: no profiler table in $PROFILE_DIR after /stop_profile" >&2; return 1; }
}

stop() {
    [ -f "$pidfile" ] || return 0
    local pid
    pid=$(cat "$pidfile")
    kill -INT -- "-$pid" 2>/dev/null || kill -INT "$pid" 2>/dev/null
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null
    rm -f "$pidfile"
}

case "$ACTION" in
start) start ;;
wait) wait_ready ;;
measure) measure ;;
profile) profile ;;
stop) stop ;;
all)
    start
    rc=1
    wait_ready && nvidia-smi --query-gpu=index,memory.used --format=csv,noheader && measure && rc=0
    stop
    exit $rc
    ;;
*) echo "dsv4_flash_serve.sh: ACTION=$ACTION; valid: all, start, wait, measure, profile, stop" >&2; exit 2 ;;
esac
