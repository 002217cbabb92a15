# one H200, after staging the 7 chunks in /tmp/b1: install vLLM, the cold_l2 GPU test, Flash 256 with both flushes
set -u
t0=$(date +%s)
BUNDLE=/tmp/b1 bash nvfp4stack/bundle/gpu_host.sh install 2>&1 | tail -1
echo "install: $(( $(date +%s) - t0 )) s"
export PYTHONPATH="$(bash nvfp4stack/bundle/gpu_host.sh pythonpath):$PWD"
mkdir -p $OUT
cat /tmp/machine.txt
python3 -c "import torch, triton, vllm; print(torch.__version__, triton.__version__, vllm.__version__)" 2>&1 | tail -1
timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest tests/bench/test_cold_l2.py 2>&1 | grep -E "assert|Error|passed|failed" | tail -8 | tee $OUT/test_cold_l2.txt
for l2 in cold cold-dirty; do
  t1=$(date +%s)
  timeout 240 python3 -m nvfp4stack.bench.moe_few_tokens --shape flash --experts 256 --top-k 6 --tokens 1,2,4,8 --no-sweep --seed 0 --marlin on --humming on --l2 $l2 > $OUT/few_flash256_$l2.txt 2>&1
  echo "flash256 $l2 rc=$? $(( $(date +%s) - t1 )) s"; grep "^|" $OUT/few_flash256_$l2.txt | cut -d'|' -f2-8,12-15,17-18
done
echo "go1: $(( $(date +%s) - t0 )) s"
