export PYTHONPATH=$PWD
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
T0=$(date +%s)
for rep in 1 2; do for v in pick noscale none; do
  timeout 150 python3 scratch/floor/floor_time.py $v 5 2>&1 | tee -a $OUT/floor_time.txt | grep -v "^ROW" | tail -3
done; done
echo "timing took $(( $(date +%s) - T0 )) s"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for v in pick noscale none; do
  timeout 120 $NCU --profile-from-start off --clock-control none --cache-control all \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --csv --page details python3 scratch/floor/floor_ncu.py $v > $OUT/ncu_$v.csv 2>$OUT/ncu_$v.err; echo "ncu $v rc=$?"
done
echo "all took $(( $(date +%s) - T0 )) s"
python3 - <<'PY'
import collections, re
rows = collections.defaultdict(dict)
for line in open(f"{__import__('os').environ['OUT']}/floor_time.txt"):
    if line.startswith("ROW"):
        _, v, shape, kind, t, med, rng, hbm = line.split()
        rows[(shape, kind, t)].setdefault(v, []).append((float(med), hbm))
print(f"{'load':28s} " + "  ".join(f"{v:>18s}" for v in ("pick", "noscale", "none")))
for k, d in rows.items():
    cells = []
    for v in ("pick", "noscale", "none"):
        m = d.get(v, [])
        cells.append(" / ".join(f"{a:.1f}" for a, _ in m) + (f" {m[0][1]}" if m else ""))
    print(f"{' '.join(k):28s} " + "  ".join(f"{c:>18s}" for c in cells))
PY
