"""``--drafter dspark`` picks the shipped drafter of the loaded target (issue 16 item 5), in the
package or in the user's store outside git (issue 36)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark.drafters.registry import TRAINABLE
from dspark.errors import DsparkError
from dspark.formats import shipped
from dspark.formats.build import build_drafter
from dspark.formats.folder import save_drafter
from dspark.formats.shipped_record import ShippedRecord, file_digests, records_json, target_record
from dspark.targets import TargetAdapter
from tests.unit.drafters.builders import build


@pytest.fixture(autouse=True)
def empty_store(tmp_path, monkeypatch):
    """The user's store is this test's own folder (empty), never the machine's."""
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "drafters"


def test_the_embedded_target_gets_its_own_shipped_drafters():
    from dspark.presets.tiny import resolve_target

    tiny = TargetAdapter.from_pretrained(resolve_target("tiny"))
    for method in TRAINABLE:
        folder = shipped.shipped_drafter_dir(method, tiny)
        assert folder == shipped.shipped_root() / "tiny" / method
        assert build_drafter(method, tiny) is not None
    assert shipped.shipped_drafter_dir("dspark") == shipped.shipped_root() / "tiny" / "dspark"


def test_a_target_without_shipped_drafters_gets_a_one_line_error(target):
    with pytest.raises(DsparkError) as e:
        build_drafter("dspark", target)
    message = str(e.value)
    assert "no shipped dspark drafter for this target" in message and "tiny" in message
    assert "\n" not in message


def test_the_folder_is_chosen_by_the_targets_fingerprint(tmp_path, monkeypatch, target, tiny_qwen3):
    """Two shipped targets of the same shape (vocabulary, depth): the embedding/head hash decides."""
    other = TargetAdapter(type(tiny_qwen3)(tiny_qwen3.config))  # same shape, other random weights
    with torch.no_grad():
        other.model.get_input_embeddings().weight.normal_()
        other.model.get_output_embeddings().weight.normal_()
    save_drafter(tmp_path / "a" / "dflash", build("dflash", target), target)
    save_drafter(tmp_path / "b" / "dflash", build("dflash", other), other)
    monkeypatch.setattr(shipped, "shipped_root", lambda: tmp_path)
    assert shipped.shipped_targets("dflash") == ["a", "b"]
    assert shipped.shipped_drafter_dir("dflash", target) == tmp_path / "a" / "dflash"
    assert shipped.shipped_drafter_dir("dflash", other) == tmp_path / "b" / "dflash"
    assert build_drafter("dflash", other) is not None  # and it loads: the fingerprint matched
    with pytest.raises(DsparkError, match="shipped dspark drafters: none"):
        shipped.shipped_drafter_dir("dspark", target)


def test_a_drafter_in_the_store_is_found_after_the_package(tmp_path, monkeypatch, target, empty_store):
    package = tmp_path / "package"
    package.mkdir()
    monkeypatch.setattr(shipped, "shipped_root", lambda: package)
    assert shipped.store_root() == empty_store and shipped.drafter_roots() == [package, empty_store]
    save_drafter(empty_store / "mine" / "dflash", build("dflash", target), target)
    assert shipped.shipped_drafter_dir("dflash", target) == empty_store / "mine" / "dflash"
    assert build_drafter("dflash", target) is not None
    save_drafter(package / "mine" / "dflash", build("dflash", target), target)  # the package wins
    assert shipped.shipped_drafter_dir("dflash", target) == package / "mine" / "dflash"
    with pytest.raises(DsparkError, match="shipped eagle3 drafters: none"):
        shipped.shipped_drafter_dir("eagle3", target, root=package)  # root given: that root alone


def test_a_recorded_drafter_missing_here_names_the_command_that_makes_it(tmp_path, monkeypatch, target):
    """The package keeps the record (target fingerprint, file digests, τ) of a drafter that
    lives outside git; without its weights, the error says where they go and how to make them."""
    made = save_drafter(tmp_path / "made" / "dspark", build("dspark_markov", target), target)
    record = ShippedRecord(
        steps=10, epochs=1.0, training_tokens=100, target=target_record(made), files=file_digests(made)
    )
    assert record.target["target_sha256"] and set(record.files) == {"config.json", "model.safetensors"}
    package = tmp_path / "package"
    (package / "mine").mkdir(parents=True)
    (package / "mine" / "SHIPPED.json").write_text(records_json({"dspark": record}))
    monkeypatch.setattr(shipped, "shipped_root", lambda: package)
    assert ShippedRecord.from_json(record.as_json()) == record
    with pytest.raises(DsparkError) as e:
        build_drafter("dspark", target)
    message = str(e.value)
    assert "\n" not in message and "not on this machine" in message
    assert str(shipped.store_root() / "mine" / "dspark") in message
    assert "dspark campaign --target mine" in message and "scripts/ship_drafters.py" in message
    with pytest.raises(DsparkError, match="the eagle3 drafter of mine is not on this machine"):
        build_drafter("eagle3", target)  # a method without a record: the target is still known
    assert shipped.recorded_target(target) == "mine"
    other = TargetAdapter(type(target.model)(target.model.config))  # same shape, other weights
    assert shipped.recorded_target(other) is None


def test_ship_drafters_sends_smollm2s_to_the_store_and_keeps_the_records_in_the_package(tmp_path):
    """scripts/ship_drafters.py: the tiny target's drafters go into the package, every other
    target's into the store; the records go to the package unless --dest names a folder."""
    import importlib.util

    script = Path(__file__).resolve().parents[3] / "scripts" / "ship_drafters.py"
    spec = importlib.util.spec_from_file_location("ship_drafters", script)
    ship = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship)
    ns = ship.parse_args(["--campaign", "c", "--target", "smollm2"])
    assert ns.dest == shipped.store_root() == tmp_path / "cache" / "drafters"
    assert ns.records == ship.PACKAGE / "smollm2" / "SHIPPED.json"
    assert ship.parse_args(["--campaign", "c", "--target", "tiny"]).dest == ship.PACKAGE
    ns = ship.parse_args(["--campaign", "c", "--target", "tiny", "--dest", str(tmp_path / "d")])
    assert ns.records == tmp_path / "d" / "tiny" / "SHIPPED.json"  # never the package's by accident
