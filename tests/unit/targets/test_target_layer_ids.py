"""Default and user-given feature layers (DESIGN §4)."""

from __future__ import annotations

import pytest

from dspark.targets import default_layer_ids, validate_layer_ids


def test_deepspec_qwen3_4b_choice():
    assert default_layer_ids(36) == (1, 9, 17, 25, 33)


@pytest.mark.parametrize(
    ("num_layers", "expected"),
    [(12, (1, 3, 5, 7, 9)), (7, (1, 2, 3, 4, 5)), (4, (0, 1, 2)), (3, (0, 1)), (2, (0,)), (1, ())],
)
def test_small_targets(num_layers, expected):
    assert default_layer_ids(num_layers) == expected


@pytest.mark.parametrize("num_layers", range(2, 81))
def test_defaults_are_valid_and_spread(num_layers):
    ids = default_layer_ids(num_layers)
    assert len(ids) == min(5, num_layers - 1)
    assert list(ids) == sorted(set(ids))  # distinct, increasing
    assert ids[0] >= 0 and ids[-1] <= num_layers - 2  # never the (normed) final layer
    assert validate_layer_ids(ids, num_layers) == ids


def test_user_ids_may_include_embeddings_and_any_order():
    assert validate_layer_ids([-1, 5, 2], 8) == (-1, 5, 2)  # a folder's own order loads


def test_new_drafters_get_ascending_non_empty_ids():
    from dspark.errors import DsparkError
    from dspark.targets import parse_layer_ids

    assert parse_layer_ids("1,9,17", 30) == (1, 9, 17)
    for bad, why in (("5,2", "ascending"), ("", "empty"), ("1,29", "out of range"), ("a", "integers")):
        with pytest.raises(DsparkError, match=why):
            parse_layer_ids(bad, 30)


@pytest.mark.parametrize("bad", [(7,), (-2,), (8,), (1, 1)])
def test_user_ids_rejected(bad):
    with pytest.raises(ValueError, match="target_layer_ids"):
        validate_layer_ids(bad, 8)
