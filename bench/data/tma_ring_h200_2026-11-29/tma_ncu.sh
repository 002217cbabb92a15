# Run at git 07ad451 from the repo root on a GPU host (ncu, the profile of tma_ncu.py; the script path as it was)
export PYTHONPATH=$PWD
mkdir -p $OUT
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout 400 $NCU --profile-from-start off --clock-control none --cache-control all \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section MemoryWorkloadAnalysis --csv --page details python3 scratch/tma_ncu.py > $OUT/ncu.csv 2>$OUT/ncu.err; echo "ncu rc=$?"
tail -3 $OUT/ncu.err; wc -l $OUT/ncu.csv
