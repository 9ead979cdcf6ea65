"""planlm's format version: every manifest, planned_lm.json and planner config.json carry it, and a folder of another
format (older: written before it, or with a lower number; newer: a higher one) is refused in one line naming the
file, both formats and the fix, by the loaders, the reuse check of a stage and `planlm verify`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.models.planned_lm import PlannedLM
from planlm.models.planner import Planner
from planlm.stage import StageDir, write_manifest
from planlm.stage.integrity import FORMAT_KEY, FORMAT_VERSION, OtherFormat
from planlm.stage.verify import DamagedRun, verify, verify_run

from helpers import tiny_planned_lm, tiny_planner

OLDER = [("dropped", None, "an older", 1), ("lower", FORMAT_VERSION - 1, "an older", FORMAT_VERSION - 1),
         ("higher", FORMAT_VERSION + 1, "a newer", FORMAT_VERSION + 1)]


def _set_format(path: Path, version: int | None) -> None:
    values = json.loads(path.read_text())
    values.pop(FORMAT_KEY)
    if version is not None:
        values[FORMAT_KEY] = version
    path.write_text(json.dumps(values))


def _refused(error: pytest.ExceptionInfo, path: Path, age: str, found: int, folder: Path) -> None:
    message = str(error.value)
    assert message.startswith(f"{path} was written by {age} planlm (format {found}, this planlm reads format "
                              f"{FORMAT_VERSION}); delete {folder} and rerun "), message
    assert "\n" not in message


@pytest.mark.parametrize("how, version, age, found", OLDER, ids=[case[0] for case in OLDER])
def test_a_prepared_corpus_of_another_format_is_refused_in_one_line(synthetic_random, tmp_path, how, version, age,
                                                                    found):
    folder = tmp_path / "prepared"
    shutil.copytree(synthetic_random, folder)
    assert PreparedDataset(folder).manifest[FORMAT_KEY] == FORMAT_VERSION  # the current one loads
    _set_format(folder / "manifest.json", version)
    with pytest.raises(OtherFormat) as error:
        PreparedDataset(folder)
    _refused(error, folder / "manifest.json", age, found, folder)
    assert "`planlm prepare --out_dir" in str(error.value)


@pytest.mark.parametrize("how, version, age, found", OLDER, ids=[case[0] for case in OLDER])
def test_a_planner_of_another_format_is_refused_in_one_line(synthetic_cycle, tmp_path, how, version, age, found):
    folder = tiny_planner(PreparedDataset(synthetic_cycle)).save_pretrained(tmp_path / "planner")
    assert json.loads((folder / "config.json").read_text())[FORMAT_KEY] == FORMAT_VERSION
    assert Planner.from_pretrained(folder).config.horizon == 3  # the current one loads
    _set_format(folder / "config.json", version)
    with pytest.raises(PlanlmError) as error:
        Planner.from_pretrained(folder)
    _refused(error, folder / "config.json", age, found, folder)


@pytest.mark.parametrize("how, version, age, found", OLDER, ids=[case[0] for case in OLDER])
def test_a_planned_lm_of_another_format_is_refused_in_one_line(synthetic_random, tmp_path, how, version, age, found):
    folder = tiny_planned_lm(PreparedDataset(synthetic_random)).save_pretrained(tmp_path / "lm")
    assert json.loads((folder / "planned_lm.json").read_text())[FORMAT_KEY] == FORMAT_VERSION
    assert PlannedLM.from_pretrained(folder).adapter is not None  # the current one loads
    _set_format(folder / "planned_lm.json", version)
    with pytest.raises(PlanlmError) as error:
        PlannedLM.from_pretrained(folder)
    _refused(error, folder / "planned_lm.json", age, found, folder)


def test_the_reuse_check_refuses_a_stage_folder_of_another_format_and_leaves_it_as_it_is(tmp_path):
    folder = tmp_path / "stage"
    folder.mkdir()
    (folder / "result.txt").write_text("42")
    manifest = write_manifest(folder, {"k": 1})
    assert list(manifest)[0] == FORMAT_KEY and manifest[FORMAT_KEY] == FORMAT_VERSION
    with StageDir(folder, {"k": 1}) as stage:  # the current format: reused
        assert stage.reused
    for key in ({"k": 1}, {"k": 2}):  # the same key or another: neither reused nor rebuilt over
        _set_format(folder / "manifest.json", None)
        with pytest.raises(OtherFormat) as error:
            with StageDir(folder, key):
                pass
        _refused(error, folder / "manifest.json", "an older", 1, folder)
        assert (folder / "result.txt").read_text() == "42" and (folder / "manifest.json").is_file()
        assert not (folder / ".lock").exists()
        write_manifest(folder, {"k": 1})


def test_verify_names_a_stage_folder_of_another_format(tmp_path, capsys):
    for name in ("new", "old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.txt").write_text(name)
        write_manifest(tmp_path / name, {"name": name})
    _set_format(tmp_path / "old" / "manifest.json", None)
    rows = {folder.name: status for folder, _, status in verify_run(tmp_path)}
    assert rows["new"] == "intact"
    assert rows["old"] == f"other format: written in format 1, this planlm reads format {FORMAT_VERSION} (delete it " \
                          f"and rerun)"
    with pytest.raises(DamagedRun, match=r"1 of 2 stage folders were written by another planlm's format \(.*old\); "
                                         r"delete them and rerun"):
        verify(str(tmp_path))
