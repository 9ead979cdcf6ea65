"""A disk that fills: embedding checks its space before it allocates the file it fills in place, and a stage whose
write fails on a full disk is a one-line error naming the stage, leaves no manifest, and resumes on the rerun."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple

import numpy as np
import pytest

from planlm.data.artifacts import PreparedDataset
from planlm.data.prepare import prepare
from planlm.errors import PlanlmError
from planlm.files import human_bytes, require_space
from planlm.stage import StageDir, read_manifest

from data.test_prepare import tiny_config, tiny_jsonl

Usage = namedtuple("Usage", "total used free")


def test_require_space_names_the_stage_the_need_and_what_is_free(tmp_path, monkeypatch):
    require_space(tmp_path / "a" / "b.npy", 10, "embedding train")  # enough: nothing happens
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 5_000_000, 5_000_000))
    with pytest.raises(PlanlmError) as raised:
        require_space(tmp_path / "a" / "b.npy", 2_500_000_000, "embedding train")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("embedding train: ")
    assert "needs 2.5 GB" in message and "5.0 MB free" in message and "rerun the same command" in message
    assert human_bytes(512) == "512 B" and human_bytes(21_700_000_000) == "21.7 GB"


def test_prepare_stops_before_embedding_into_a_disk_too_small(tmp_path, monkeypatch):
    source = tiny_jsonl(tmp_path / "c.jsonl")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(PlanlmError, match=r"embedding \w+: .*embeddings\.npy needs .* but its file system has 1.0 kB free"):
        prepare(str(tmp_path / "prepared"), **tiny_config(source))
    assert not list((tmp_path / "prepared").rglob("embeddings.npy"))  # nothing allocated
    assert read_manifest(tmp_path / "prepared") is None


def test_resumed_embedding_checks_the_space_of_the_rows_left(tmp_path, monkeypatch):
    from planlm.data.embed import EmbedConfig, embed_sentences

    from data.test_prepare import SENTENCES, CountingEncoder

    monkeypatch.setattr("planlm.data.embed.CHUNK_SIZE", 4)
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: CountingEncoder(fail_after=1))
    out = tmp_path / "embeddings.npy"
    with pytest.raises(KeyboardInterrupt):  # one chunk of 4 written, 12 rows left
        embed_sentences(SENTENCES * 2, out, EmbedConfig(batch_size=4))
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: CountingEncoder())
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(PlanlmError, match=r"needs 18\.4 kB, but its file system has 1\.0 kB free"):  # 12 x 384 x 4
        embed_sentences(SENTENCES * 2, out, EmbedConfig(batch_size=4))


def test_a_write_on_a_full_disk_is_one_line_and_the_rerun_resumes_to_the_same_files(tmp_path, monkeypatch):
    source = tiny_jsonl(tmp_path / "c.jsonl")
    reference = prepare(str(tmp_path / "reference"), **tiny_config(source))

    import planlm.data.artifacts as artifacts
    save = np.save

    def full_disk(path, *args, **kwargs):  # the token arrays of the test split: the disk is full
        if "test" in str(path) and "token" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return save(path, *args, **kwargs)

    out = tmp_path / "prepared"
    monkeypatch.setattr(artifacts.np, "save", full_disk)
    with pytest.raises(PlanlmError) as raised:
        prepare(str(out), **tiny_config(source))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{out}: No space left on device while this stage wrote ")
    assert "test" in message and "never taken as complete" in message
    assert read_manifest(out) is None
    with pytest.raises(PlanlmError, match="manifest.json missing"):
        PreparedDataset(out)

    monkeypatch.setattr(artifacts.np, "save", save)
    prepare(str(out), **tiny_config(source))
    for path in sorted(reference.rglob("*.npy")):
        assert (out / path.relative_to(reference)).read_bytes() == path.read_bytes(), path


def test_a_stage_dir_turns_only_a_full_disk_into_its_one_line_error(tmp_path):
    with pytest.raises(PlanlmError, match="Disk quota exceeded while this stage wrote x.bin"):
        with StageDir(tmp_path / "stage", {"k": 1}):
            raise OSError(errno.EDQUOT, "Disk quota exceeded", "x.bin")
    with pytest.raises(PermissionError):
        with StageDir(tmp_path / "stage", {"k": 1}):
            raise PermissionError(errno.EACCES, "Permission denied", "y.bin")
