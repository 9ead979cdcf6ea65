"""``planlm actions``: per-action sizes and nearest sentences (text, Markdown, JSON) and the size plot."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planlm.cli import main as cli_main
from planlm.data.actions import actions, nearest_members
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError


def test_nearest_members_are_sorted_members():
    codebook = np.array([[0.0, 0.0], [10.0, 0.0]])
    embeddings = np.array([[3.0, 0.0], [9.0, 0.0], [1.0, 0.0], [0.5, 0.0], [12.0, 0.0], [2.0, 0.0]])
    labels = np.array([0, 1, 0, 0, 1, 0])
    got = nearest_members(embeddings, labels, codebook, num_nearest=3, chunk_size=4)
    assert [s for s, _ in got[0]] == [3, 2, 5]  # closest first, only members
    assert [s for s, _ in got[1]] == [1, 4]
    assert got[0][0][1] == pytest.approx(0.25)


def test_actions_writes_markdown_json_and_plot(synthetic_cycle, tmp_path, capsys):
    out = actions(str(synthetic_cycle), out_dir=str(tmp_path / "inspect"))
    ds = PreparedDataset(synthetic_cycle)
    train = ds["train"]
    sizes = np.bincount(np.asarray(train.actions), minlength=ds.num_actions)

    record = json.loads((out / "actions.json").read_text())
    assert record["num_actions"] == ds.num_actions == len(record["actions"])
    assert [r["size"] for r in record["actions"]] == sorted(sizes.tolist(), reverse=True)
    assert sum(r["size"] for r in record["actions"]) == train.num_sentences
    codebook = ds.codebook.numpy()
    for r in record["actions"]:
        nearest = r["nearest"]
        assert len(nearest) == min(5, r["size"])
        for n in nearest:  # members of the action, text matches the split, distances ascending
            assert train.actions[n["sentence"]] == r["action"]
            assert n["text"] == train.sentence_text(n["sentence"])
            assert n["distance"] == pytest.approx(float(((train.embeddings[n["sentence"]] - codebook[r["action"]]) ** 2).sum()), rel=1e-4)
        assert [n["distance"] for n in nearest] == sorted(n["distance"] for n in nearest)

    markdown = (out / "actions.md").read_text()
    rows = [line for line in markdown.splitlines() if line[:3].startswith("| ") and line[2].isdigit()]
    assert [int(row.split("|")[1]) for row in rows] == [r["action"] for r in record["actions"]]
    assert record["actions"][0]["nearest"][0]["text"] in markdown
    assert (out / "cluster_sizes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    printed = capsys.readouterr().out
    assert printed.count("\naction ") == min(20, ds.num_actions)  # the largest 20 at most
    assert f"action {record['actions'][0]['action']}: {record['actions'][0]['size']:,} sentences" in printed


def test_actions_cli_default_folder_and_errors(synthetic_cycle, tmp_path, capsys):
    import shutil

    prepared = tmp_path / "prepared"
    shutil.copytree(synthetic_cycle, prepared)
    cli_main(["actions", "--prepared_dir", str(prepared), "--split", "validation"])
    assert (prepared / "actions" / "actions.md").is_file()
    assert json.loads((prepared / "actions" / "actions.json").read_text())["split"] == "validation"
    capsys.readouterr()

    with pytest.raises(SystemExit) as e:
        cli_main(["actions", "--prepared_dir", str(tmp_path / "nothing")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "manifest.json missing" in err and "planlm prepare" in err and "\n" not in err
    with pytest.raises(PlanlmError, match="no split 'dev'"):
        actions(str(prepared), split="dev")
