"""``planlm codebook``: a prepared corpus with its codebook drawn from another k-means seed. The corpus, embeddings and
tokens are the source's (hard links); the codebook and the actions are its own, as ``planlm prepare`` would have
fitted them with that seed."""

from __future__ import annotations

import numpy as np
import pytest

from planlm.cli import main as cli_main
from planlm.data.artifacts import ARRAYS, SPLITS, PreparedDataset
from planlm.data.codebook import codebook
from planlm.data.corpus import CorpusConfig
from planlm.data.kmeans import ActionsConfig
from planlm.data.prepare import prepare
from planlm.errors import PlanlmError
from planlm.stage.integrity import check_files
from planlm.stage import read_manifest

from test_prepare import tiny_jsonl


def _prepare(out, corpus, num_actions: int = 3):
    return prepare(str(out), corpus=CorpusConfig(source=str(corpus), num_validation=3, num_test=3),
                   actions=ActionsConfig(num_actions=num_actions), tokenizer="bpe:300")


@pytest.fixture
def source(wiki_slice):
    return wiki_slice


def test_a_new_seed_draws_another_codebook_over_the_same_corpus(source, tmp_path):
    out = codebook(str(source), seed=7, out_dir=str(tmp_path / "seed7"))
    old, new = PreparedDataset(source), PreparedDataset(out)
    assert not np.allclose(old.codebook.numpy(), new.codebook.numpy())  # another draw of k-means
    assert new.manifest["codebook_seed"] == 7 and new.manifest["config"]["actions"]["seed"] == 7
    assert check_files(out, read_manifest(out), full=True) == []  # its manifest records its own files
    centroids = new.codebook.numpy()
    for split in SPLITS:
        a, b = old.split(split), new.split(split)
        for name in ARRAYS:
            if name in ("actions", "token_actions"):
                continue
            assert (a.path / f"{name}.npy").stat().st_ino == (b.path / f"{name}.npy").stat().st_ino  # a hard link
        # every sentence has its nearest new centroid, every token its plan sentence's action
        distances = ((np.asarray(b.embeddings)[:, None] - centroids[None]) ** 2).sum(-1)
        assert (b.actions == distances.argmin(1)).mean() > 0.99  # float ties aside
        np.testing.assert_array_equal(b.token_actions, b.actions[b.token_plan_sentence])


def test_the_sources_seed_gives_the_sources_codebook_and_a_rerun_reuses(source, tmp_path, capsys):
    seed = read_manifest(source)["config"]["actions"]["seed"]
    out = codebook(str(source), seed=seed, out_dir=str(tmp_path / "same"))
    np.testing.assert_array_equal(PreparedDataset(out).codebook.numpy(), PreparedDataset(source).codebook.numpy())
    for split in SPLITS:
        np.testing.assert_array_equal(PreparedDataset(out).split(split).actions, PreparedDataset(source).split(split).actions)
        # written a chunk at a time by each, the same bytes
        assert (out / split / "token_actions.npy").read_bytes() == (source / split / "token_actions.npy").read_bytes()
    manifest = (out / "manifest.json").stat().st_mtime_ns
    capsys.readouterr()
    codebook(str(source), seed=seed, out_dir=str(out))
    assert "reusing it" in capsys.readouterr().out and (out / "manifest.json").stat().st_mtime_ns == manifest


def test_a_rebuilt_source_never_changes_a_codebook_folder(tmp_path):
    """The writers of a prepared folder replace their files: a linked codebook folder keeps its bytes."""
    corpus = tiny_jsonl(tmp_path / "corpus.jsonl", num_articles=12)
    copy = _prepare(tmp_path / "copy", corpus)
    out = codebook(str(copy), seed=3, out_dir=str(tmp_path / "seed3"))
    assert PreparedDataset(out).tokenizer_name == str((out / "tokenizer").resolve())  # its own link of the BPE
    _prepare(copy, corpus, num_actions=2)  # another config: the split files written again, the embeddings kept
    assert read_manifest(copy)["num_actions"] == 2
    assert check_files(out, read_manifest(out), full=True) == []


def test_bad_inputs_and_the_cli(source, tmp_path, capsys):
    with pytest.raises(PlanlmError, match="not a finished prepared folder"):
        codebook(str(tmp_path / "nothing"), seed=1)
    with pytest.raises(PlanlmError, match="is the prepared folder itself"):
        codebook(str(source), seed=1, out_dir=str(source))
    cli_main(["codebook", "--prepared_dir", str(source), "--seed", "2", "--out_dir", str(tmp_path / "two")])
    assert (tmp_path / "two" / "manifest.json").is_file()
    assert "k-means seed 2" in capsys.readouterr().out
