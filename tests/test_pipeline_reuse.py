"""A re-run reuses a finished stage only under the config that produced it."""
import dataclasses

import pytest

from trsi_jax.config import rpr_stage
from trsi_jax.pipeline import built_in_tasks
from trsi_jax.pipeline.reuse import check_reuse, differences, fingerprint


def _record(rpr):
    return fingerprint(stage=rpr, previous=fingerprint(init_hf="/models/base"))


def test_changed_field_stops_reuse_with_its_name_and_what_to_delete():
    old = _record(rpr_stage(1))
    new = _record(dataclasses.replace(rpr_stage(1), policy_optim=dataclasses.replace(rpr_stage(1).policy_optim, lr=3e-4)))
    assert differences(old, new) == [f"stage.policy_optim.lr: {rpr_stage(1).policy_optim.lr!r} -> 0.0003"]
    with pytest.raises(ValueError, match=r"stage\.policy_optim\.lr.*rm -r w/rpr-1 w/rsr-2 w/rpr-2"):
        check_reuse("stage rpr-1", old, new, ["w/rpr-1", "w/rsr-2", "w/rpr-2"])
    # An upstream change reaches every later stage through the nested record.
    moved = fingerprint(stage=rpr_stage(1), previous=fingerprint(init_hf="/models/other"))
    assert differences(old, moved) == ["previous.init_hf: '/models/base' -> '/models/other'"]


def test_speed_knobs_and_json_round_trip_keep_reuse():
    old = _record(rpr_stage(1))
    check_reuse("stage rpr-1", old, _record(dataclasses.replace(rpr_stage(1), concurrency=64)), [])
    check_reuse("stage rpr-1", old, old, [])
    check_reuse("stage rpr-1", None, old, [])  # an older workdir without records: reused, with a warning


def test_task_folder_written_with_other_flags_is_refused(tmp_path):
    folder = str(tmp_path / "train")
    assert len(built_in_tasks(folder, "train", 1, ["files"])) == 1
    with pytest.raises(ValueError, match=r"holds \{'files': 1\}.*\{'files': 2\} were asked"):
        built_in_tasks(folder, "train", 2, ["files"])
