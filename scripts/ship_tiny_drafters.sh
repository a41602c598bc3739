#!/usr/bin/env bash
# Train the shipped tiny drafters (DFlash, DSpark, Eagle3) for the embedded tiny target with
# equal budgets (same steps, batch, anchors, learning rate, data), then copy them in bf16
# into the package (src/dspark/assets/drafters/<method>).
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
  python -c "import torch; from dspark.drafters.folder import convert_folder; \
convert_folder('$RUNS/$method/drafter', 'src/dspark/assets/drafters/$method', torch.bfloat16)"
}
for method in dflash dspark eagle3; do train "$method" & done
wait
cat "$RUNS/wall_times.txt"
