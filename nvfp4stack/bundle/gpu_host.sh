#!/usr/bin/env bash
# On an offline GPU host, from the repository root (README "Running on an offline GPU host"):
#   bash nvfp4stack/bundle/gpu_host.sh stage CHUNK_DIR...   copy carried chunk folders into $BUNDLE
#   bash nvfp4stack/bundle/gpu_host.sh install              verify every chunk, install into $SITE
#   bash nvfp4stack/bundle/gpu_host.sh pythonpath           the PYTHONPATH that sees $SITE (its .pth files too)
#   bash nvfp4stack/bundle/gpu_host.sh wait-ready LOG PID [TIMEOUT_S]
#       wait until `serve`'s output LOG says "engine ready" (exit 0), PID exits or TIMEOUT_S passes (1)
#   bash nvfp4stack/bundle/gpu_host.sh serve-check RECIPE CKPT BF16 [overrides...]
#       `python main.py recipe=RECIPE model.path=CKPT serve` in the background; once ready, the openai
#       client checks and the logprob deltas against the reference (nvfp4stack.engine.openai_check);
#       then Ctrl-C. Prints the result table last. With NVFP4STACK_FAULTHANDLER_S=N every Python
#       process of the server dumps its stacks after N s (to find where an engine start hangs).
set -euo pipefail
BUNDLE=${BUNDLE:-/tmp/nvfp4stack-bundle}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/nvfp4stack-out}
mkdir -p "$OUT"

# $SITE and what its .pth files add to sys.path: pip --target does not run them, and
# nvidia-cutlass-dsl (vLLM's DeepSeek-V4 compressor) puts its `cutlass` package on the path that way.
site_path() {
    local p
    p=$(python3 -c 'import site, sys; before = set(sys.path); site.addsitedir(sys.argv[1]); print(":".join(p for p in sys.path if p not in before))' "$SITE") \
        && [ -n "$p" ] || { echo "gpu_host.sh: could not read the site directory SITE=$SITE (expected the --target of install)" >&2; return 1; }
    echo "$p"
}

# "engine ready" in serve's output $1 while process $2 lives, within $3 s (default 600)
wait_ready() {
    local _
    for _ in $(seq 1 "${3:-600}"); do
        grep -q "engine ready" "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 1
    done
    return 1
}

case "${1:-}" in
stage)
    shift
    mkdir -p "$BUNDLE"
    for d in "$@"; do cp -r "$d" "$BUNDLE/"; done
    ls "$BUNDLE"
    ;;
install)
    bash install.sh --offline "$BUNDLE" --target "$SITE"
    # the project itself, so vLLM finds its `vllm.general_plugins` entry point in every process
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$SITE" --upgrade .
    sp=$(site_path)
    PYTHONPATH="$sp" python3 -c "import vllm, openai, hydra; print('vllm', vllm.__version__, '| openai', openai.__version__)"
    ;;
pythonpath)
    site_path
    ;;
wait-ready)
    wait_ready "$2" "$3" "${4:-600}"
    ;;
serve-check)
    recipe=$2 ckpt=$3 bf16=$4
    shift 4
    sp=$(site_path)
    export PYTHONPATH="$sp:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [ -n "${NVFP4STACK_FAULTHANDLER_S:-}" ]; then
        mkdir -p /tmp/nvfp4stack-fh
        cat > /tmp/nvfp4stack-fh/sitecustomize.py <<'PY'
import faulthandler, os
faulthandler.dump_traceback_later(float(os.environ["NVFP4STACK_FAULTHANDLER_S"]), exit=False,
                                  file=open(f"/tmp/nvfp4stack-fh/stacks-{os.getpid()}.txt", "w"))
PY
        export PYTHONPATH="/tmp/nvfp4stack-fh:$PYTHONPATH"
    fi
    port=${PORT:-8011}
    t0=$(date +%s)
    python3 main.py "recipe=$recipe" "model.path=$ckpt" "engine.port=$port" "run_dir=$OUT/serve" "$@" serve \
        > "$OUT/serve_stdout.log" 2>&1 &
    pid=$!
    ready=""
    wait_ready "$OUT/serve_stdout.log" $pid "${READY_TIMEOUT_S:-600}" && ready=1
    echo "ready after $(( $(date +%s) - t0 )) s: ${ready:-no}"
    rc=0
    if [ -n "$ready" ]; then
        python3 -m nvfp4stack.engine.openai_check --base-url "http://127.0.0.1:$port/v1" --bf16 "$bf16" \
            --nvfp4 "$ckpt" --json "$OUT/openai_check.json" ${THROUGHPUT:+--throughput $THROUGHPUT} ${NO_LOGPROBS:+--no-logprobs} || rc=$?
        grep -E "nvfp4stack: |quantization=" "$OUT/serve/vllm_server.log" | sed 's/compilation_config.*//' | head -8 || true
    else
        rc=1
        tail -30 "$OUT/serve_stdout.log"; tail -60 "$OUT/serve/vllm_server.log" 2>/dev/null || true
        cat /tmp/nvfp4stack-fh/stacks-*.txt 2>/dev/null | head -300 || true
    fi
    kill -INT $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    cp "$OUT/serve/vllm_server.log" "$OUT/" 2>/dev/null || true
    exit $rc
    ;;
*)
    echo "usage: $0 stage DIR... | install | pythonpath | wait-ready LOG PID [S] | serve-check RECIPE CKPT BF16 [overrides...]" >&2
    exit 2
    ;;
esac
