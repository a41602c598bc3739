"""Save the first N decoder layers of a target (embedding, final norm and LM head kept) as
an HF folder: a same-tokenizer ``assistant_model`` for HF assisted generation when the
target family has no smaller sibling (SmolLM2-135M is the smallest SmolLM2).

Usage: python scripts/truncated_assistant.py TARGET OUT_DIR [LAYERS]   (TARGET may be "smollm2")
"""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark.presets.tiny import resolve_target


def main(target: str, out: Path, layers: int) -> None:
    source = resolve_target(target)
    model = AutoModelForCausalLM.from_pretrained(source)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    print(f"saved {layers} of the target's layers to {out}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 6)
