#!/usr/bin/env bash
# The prepared device run's entry on the GPU machine, run once per device call from the repository root:
#   bash scripts/device/device.sh --call call-1 --budget-s 180
# Installs the carried wheels once (into /tmp/site), points dspark's cache at the stash that
# outlives each call while the machine stays warm, and runs scripts/device/run.py with the
# same arguments. scripts/device/plan.py prints each call's full command.
set -u
cd "$(dirname "$0")/../.."
STASH="${DSPARK_DEVICE_STASH:-/tmp/dspark-device}"
call=""
prev=""
for arg in "$@"; do
  [ "$prev" = "--call" ] && call="$arg"
  prev="$arg"
done
mkdir -p "$STASH/whl" /tmp/site
if [ -n "$call" ] && [ -d ".device/$call/whl" ]; then cp .device/"$call"/whl/*.whl "$STASH/whl/"; fi
if ls "$STASH"/whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$STASH"/whl/*.whl && touch /tmp/site/.installed
fi
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" DSPARK_CACHE="$STASH/cache"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export DSPARK_DEVICE_STASH="$STASH"
exec python3 scripts/device/run.py "$@"
