# one H200: where ours' engine start spends the ~90 s between vLLM's profiling run and its CUDA-graph memory profiling:
# Python stacks of every process every 15 s (faulthandler via sitecustomize), one ours server start, batch 1, 1 round
set -u
BUNDLE=/tmp/b1 bash nvfp4stack/bundle/gpu_host.sh install 2>&1 | tail -1
export PYTHONPATH="$(bash nvfp4stack/bundle/gpu_host.sh pythonpath):$PWD"
mkdir -p /tmp/fh && cat > /tmp/fh/sitecustomize.py <<'PY'
import faulthandler, os
faulthandler.dump_traceback_later(15.0, repeat=True, exit=False, file=open(f"/tmp/fh/stacks-{os.getpid()}.txt", "w"))
PY
export PYTHONPATH="/tmp/fh:$PYTHONPATH"
date -u +%T
timeout 480 python3 main.py recipe=tiny_v3_h200 bench=engine run_dir=/tmp/eb cache_dir=/tmp/nvc engine.max_model_len=4096 \
  engine.max_num_seqs=256 engine.gpu_memory_utilization=0.9 \
  "engine.compilation_config='{\"cudagraph_capture_sizes\":[1,8,32,128,256]}'" bench.engine_model=drawn bench.engine_model_layers=32 \
  "bench.engine_batches=[1]" bench.engine_prefill_prompts=0 bench.engine_rounds=1 \
  "bench.engine_settings=[triton_w4a16]" bench.engine_servers=sequential bench > /tmp/engine.txt 2>&1
echo "rc=$?"; date -u +%T
grep -E "ready in|decode batch 1:" /tmp/engine.txt | cut -c1-200
grep -h "Initial profiling\|Profiling CUDA graph memory\|init engine" /tmp/eb/*/vllm_server.log | cut -c1-160
mkdir -p $OUT/fh && cp /tmp/fh/stacks-*.txt $OUT/fh/ 2>/dev/null; cp /tmp/eb/*/vllm_server.log $OUT/fh/ 2>/dev/null
(cd $OUT && tar czf fh.tgz fh && rm -rf fh); ls -la $OUT
