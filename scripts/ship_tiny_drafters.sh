#!/usr/bin/env bash
# The first shipped tiny drafters' recipe (300 steps, BENCHMARKS.md "Shipped tiny drafters"):
# DFlash, DSpark and Eagle3 for the embedded tiny target with equal budgets (same steps,
# batch, anchors, learning rate, data), copied in bf16 into the package
# (src/dspark/assets/drafters/tiny/<method>). The drafters shipped today are the converged
# ones of `dspark campaign` (then scripts/ship_drafters.py); this script is the short recipe
# for comparison, and its copies overwrite them: commit only on purpose.
# Usage: scripts/ship_tiny_drafters.sh [STEPS]
# The three trainings run side by side, one torch thread each; wall times go to
# runs/tiny-drafters/wall_times.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-300}
RUNS=runs/tiny-drafters
mkdir -p "$RUNS"
train() {
  local method=$1 start
  start=$(date +%s)
  dspark --threads 1 train --drafter "$method" --data tiny-corpus --out "$RUNS/$method" --steps "$STEPS" \
    --batch-size 8 --micro-batch-size 4 --num-anchors 64 --max-length 512 --lr 1e-3 \
    --save-every 100 --eval-every 100 --seed 0 > "$RUNS/$method.log" 2>&1
  echo "$method $(( $(date +%s) - start )) s" >> "$RUNS/wall_times.txt"
  python -c "import torch; from dspark.formats.folder import convert_folder; \
convert_folder('$RUNS/$method/drafter', 'src/dspark/assets/drafters/tiny/$method', torch.bfloat16)"
}
for method in dflash dspark eagle3; do train "$method" & done
wait
cat "$RUNS/wall_times.txt"
