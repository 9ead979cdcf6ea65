"""Shared fixtures: tiny synthetic prepared corpora (no sentence encoder, seconds to build)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from planlm.data.synthetic import make_synthetic_prepared

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def synthetic_cycle(tmp_path_factory):
    """8 actions, a_{i+1} = a_i + 1 mod 8; 200/20/20 articles of 4-9 sentences; 16-d embeddings."""
    return make_synthetic_prepared(tmp_path_factory.mktemp("synthetic_cycle"), rule="cycle", seed=0)


@pytest.fixture(scope="session")
def synthetic_random(tmp_path_factory):
    """8 actions drawn uniformly: only an oracle knows the next sentence's action."""
    return make_synthetic_prepared(tmp_path_factory.mktemp("synthetic_random"), rule="random", seed=1)
