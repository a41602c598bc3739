"""`dspark campaign --status` read from a campaign folder alone."""

from __future__ import annotations

import json

from dspark.pipeline.campaign.progress import status


def test_status_names_the_stages_started_and_not_finished(tmp_path):
    stages, data = tmp_path / "stages", tmp_path / "data"
    stages.mkdir()
    data.mkdir()
    (stages / "regenerate.started.json").write_text(json.dumps({"prompts": 3000}))
    (data / "answers.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n')
    report = status(tmp_path)
    assert report["stages_done"] == []
    assert report["in_progress"] == {"regenerate": {"answers": 2, "prompts": 3000}}

    (stages / "regenerate.json").write_text("{}")  # finished: no longer in progress
    (stages / "train-dspark.started.json").write_text("{}")
    report = status(tmp_path)
    assert report["stages_done"] == ["regenerate"]
    assert report["in_progress"] == {"train-dspark": {}}


def test_status_counts_the_cache_pieces_written(tmp_path):
    stages, pieces = tmp_path / "stages", tmp_path / "cache" / "pieces"
    stages.mkdir()
    pieces.mkdir(parents=True)
    summary = {"prompts": 3000, "failed": 2}
    (stages / "regenerate.json").write_text(json.dumps({"summary": summary}))
    (stages / "cache.started.json").write_text("{}")
    (pieces / "build.json").write_text("{}")  # the build's identity, not a piece
    for k, n in enumerate((64, 64, 10)):
        (pieces / f"{k:05d}.json").write_text(json.dumps({"shards": [], "placements": [[0, "f", 0, 1]] * n}))
    report = status(tmp_path)
    assert report["in_progress"] == {"cache": {"pieces": 3, "samples": 138, "of_samples": 2998}}
