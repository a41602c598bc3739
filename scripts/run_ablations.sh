#!/usr/bin/env bash
# The paper's two ablations on the embedded tiny target, with the budget BENCHMARKS.md reports:
# depth (Fig. 3: DSpark 1/2/5 layers vs a 5-layer DFlash) and block size (Fig. 4: draft length
# 4/8/12/16 for DSpark and DFlash). Every variant of a sweep gets the same training budget and
# decodes the same prompts with the same seeds. Reports land in docs/ablation_{depth,block_size}.
# Usage: scripts/run_ablations.sh [STEPS]   (one torch thread; ~1 h on a shared 2-core machine)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-150}
COMMON=(--steps "$STEPS" --batch-size 8 --micro-batch-size 4 --num-anchors 64 --max-length 256 --lr 1e-3
  --bench math,code,chat --limit 10 --max-tokens 64 --temperature 1.0 --no-progress)
mkdir -p runs
/usr/bin/time -f "depth sweep %e s" dspark --threads 1 sweep depth --layers 1,2,5 --baseline-layers 5 \
  "${COMMON[@]}" --out runs/ablation_depth
/usr/bin/time -f "block-size sweep %e s" dspark --threads 1 sweep block-size --lengths 4,8,12,16 \
  --methods dspark,dflash "${COMMON[@]}" --out runs/ablation_block_size
for kind in depth block_size; do
  mkdir -p "docs/ablation_$kind"
  cp runs/ablation_$kind/*.md runs/ablation_$kind/*.png runs/ablation_$kind/*.json "docs/ablation_$kind/" 2>/dev/null || true
done
