export PYTHONPATH=$PWD
mkdir -p $OUT
T0=$(date +%s)
for rep in 1 2; do for v in pick ws:2:1:80:4 ws:4:1:80:4 ws:6:1:80:4 ws:3:1:64:4; do
  timeout 120 python3 scratch/ws/ws_time.py $v 5 >> $OUT/ws_time.txt 2>&1; echo "$v rc=$? $(( $(date +%s) - T0 )) s"
  [ $rep = 1 ] && [ $v = ws:2:1:80:4 ] && grep -E "Error|error" $OUT/ws_time.txt | tail -5
done; done
python3 - <<'PY'
import collections, os
rows = collections.defaultdict(dict)
for l in open(os.environ["OUT"] + "/ws_time.txt"):
    if l.startswith("ROW"):
        p = l.split()
        rows[(p[2], p[3], p[4])].setdefault(p[1], []).append(float(p[5]))
vs = ["pick", "ws:2:1:80:4", "ws:4:1:80:4", "ws:6:1:80:4", "ws:3:1:64:4"]
print("load".ljust(24) + "".join(v.rjust(14) for v in vs))
for k, d in rows.items():
    print(" ".join(k).ljust(24) + "".join(("/".join(f"{x:.1f}" for x in d.get(v, []))).rjust(14) for v in vs))
PY
grep -c "equal=True" $OUT/ws_time.txt; grep -o "rel=[0-9.e-]*" $OUT/ws_time.txt | sort | uniq -c | sort -rn | head -5; grep "finite=False" $OUT/ws_time.txt | head -3
