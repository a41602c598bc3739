"""Choices and help texts come from the registries: a new row shows up without a CLI edit (issue 13)."""

from __future__ import annotations

import dataclasses

import pytest

from dspark.cli import main
from dspark.drafters.kinds import KINDS, DrafterKind
from dspark.drafters.registry import MASK_TOKEN_METHODS, TRAINABLE
from dspark.scheduler import policies


def _help(command: str, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "2000")
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def test_train_choices_are_the_rows_of_kinds(capsys, monkeypatch):
    assert tuple(KINDS) == TRAINABLE
    assert tuple(k.name for k in KINDS.values() if k.uses_mask_token) == MASK_TOKEN_METHODS
    line = next(x for x in _help("train", capsys, monkeypatch).splitlines() if "--drafter {" in x)
    assert "{" + ",".join(KINDS) + "}" in line
    for kind in KINDS.values():  # every row names a real module, config and drafter
        assert dataclasses.is_dataclass(kind.config_cls) and kind.drafter_cls.__name__ == kind.drafter_name
        assert kind.config_cls.__module__ == kind.drafter_cls.__module__ == kind.module


def test_serve_scheduler_help_lists_every_policy_row(capsys, monkeypatch):
    line = next(x for x in _help("serve", capsys, monkeypatch).splitlines() if "verification policy" in x)
    for rule in policies.POLICIES.values():
        assert (rule.spelling or rule.name) in line
    extra = policies.PolicyRule(name="made-up", lengths=policies.POLICIES["fixed"].lengths)
    monkeypatch.setitem(policies.POLICIES, "made-up", extra)  # a new row reaches the help unedited
    assert "prefix-async | made-up" in _help("serve", capsys, monkeypatch)


def test_a_kind_row_is_all_the_folder_config_needs():
    kind: DrafterKind = KINDS["dspark"]
    raw = {"num_hidden_layers": 2, "block_size": 4, "target_layer_ids": [0, 1], "mask_token_id": 5}
    config = kind.config_from_fields(raw)
    assert type(config) is kind.config_cls and (config.num_layers, config.block_size) == (2, 4)
