#!/usr/bin/env bash
# Train the shipped tiny drafters (DFlash, DSpark, Eagle3) for the embedded tiny target with
# equal budgets, then copy them in bf16 into the package (src/dspark/assets/drafters/<method>).
# Usage: scripts/ship_tiny_drafters.sh [STEPS]   (records wall time per drafter in runs/tiny-drafters/)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-400}
RUNS=runs/tiny-drafters
mkdir -p "$RUNS"
for method in dflash dspark eagle3; do
  start=$(date +%s)
  dspark train --drafter "$method" --data tiny-corpus --out "$RUNS/$method" --steps "$STEPS" \
    --batch-size 8 --micro-batch-size 4 --num-anchors 64 --max-length 512 --lr 1e-3 \
    --save-every 100 --threads 2 --no-resume
  echo "$method $(( $(date +%s) - start )) s" >> "$RUNS/wall_times.txt"
  python -c "import torch; from dspark.drafters.folder import convert_folder; \
convert_folder('$RUNS/$method/drafter', 'src/dspark/assets/drafters/$method', torch.bfloat16)"
done
cat "$RUNS/wall_times.txt"
