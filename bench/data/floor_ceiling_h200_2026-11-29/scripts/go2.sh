# the same warm H200: Pro 48 and Flash 64 with the clean flush, Marlin; the no-dequant floor at 14 loads
set -u
t0=$(date +%s)
export PYTHONPATH="$(bash nvfp4stack/bundle/gpu_host.sh pythonpath):$PWD"
mkdir -p $OUT
timeout 200 python3 -m nvfp4stack.bench.moe_few_tokens --shape pro --experts 48 --top-k 6 --tokens 1,2,4,8 --no-sweep --seed 0 --marlin on --humming off > $OUT/few_pro48_cold.txt 2>&1
echo "pro48 rc=$? $(( $(date +%s) - t0 )) s"; grep "^|" $OUT/few_pro48_cold.txt | cut -d'|' -f2-8,12-15
timeout 200 python3 -m nvfp4stack.bench.moe_few_tokens --shape flash --experts 64 --top-k 6 --rows 1,2,4,8,16 --no-sweep --seed 0 --marlin on --humming off > $OUT/few_flash64_rows_cold.txt 2>&1
echo "flash64 rows rc=$? $(( $(date +%s) - t0 )) s"; grep "^|" $OUT/few_flash64_rows_cold.txt | cut -d'|' -f2-8,12-15
echo "go2: $(( $(date +%s) - t0 )) s"
