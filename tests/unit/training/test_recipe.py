"""``train_config`` is the one place a TrainConfig is built from a caller's recipe (issue 13)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import dspark
from dspark.training.recipe import train_config


@dataclass(frozen=True)
class Recipe:
    batch_size: int = 6
    micro_batch_size: int = 3
    lr: float = 2e-3
    num_anchors: int | None = None
    seed: int = 7


def test_recipe_fields_map_onto_the_trainer_fields(tmp_path):
    cfg = train_config(tmp_path / "run", Recipe(), max_steps=4, save_every=2, progress=False)
    assert cfg.output_dir == str(tmp_path / "run") and cfg.max_steps == 4
    assert (cfg.global_batch_size, cfg.micro_batch_size, cfg.lr) == (6, 3, 2e-3)
    assert (cfg.num_anchors, cfg.seed, cfg.save_every, cfg.progress) == (None, 7, 2, False)
    assert cfg.keep_last is None and cfg.log_every == 10  # untouched fields keep TrainConfig's defaults


def test_no_other_module_builds_a_train_config():
    root = Path(dspark.__file__).parent
    builders = sorted(
        str(p.relative_to(root)) for p in root.rglob("*.py") if re.search(r"\bTrainConfig\(", p.read_text())
    )
    assert builders == ["training/recipe.py"]
