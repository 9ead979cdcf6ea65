"""experiments/seed_levers.py: its levers change train_lm only inside their context, and its seed x document split
of the seed variance gives the known answer on made-up evaluations. Seconds."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from experiments.seed_levers import lever, seed_by_document

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`


def write_evaluations(run, diffs: np.ndarray, tokens: list[int]) -> None:
    """eval/{fixed,oracle}/seed<s>/per_article.csv with two pieces per document and the paired per-token NLL
    difference of document d under seed s equal to diffs[s, d]."""
    for condition, shift in (("fixed", 0.0), ("oracle", 1.0)):
        for s in range(diffs.shape[0]):
            folder = run / "eval" / condition / f"seed{s}"
            folder.mkdir(parents=True)
            with open(folder / "per_article.csv", "w", newline="") as f:
                out = csv.writer(f)
                out.writerow(["article", "id", "source", "nll_sum", "tokens"])
                for d, n in enumerate(tokens):
                    per_token = 5.0 + shift * diffs[s, d]
                    for piece in range(2):  # two pieces of one source document
                        out.writerow([2 * d + piece, f"doc{d}#{piece}", f"doc{d}", per_token * n / 2, n // 2])


def test_without_interaction_a_larger_evaluation_set_removes_nothing(tmp_path):
    rng = np.random.default_rng(0)
    seeds, docs = 5, 8
    diffs = rng.normal(0, 0.01, (seeds, 1)) + rng.normal(0, 0.02, (1, docs))  # seed + document effects only
    write_evaluations(tmp_path, diffs, tokens=[100 + 20 * d for d in range(docs)])
    split = seed_by_document(tmp_path, list(range(seeds)))
    assert split["documents"] == docs
    assert split["interaction_share"] == pytest.approx(0.0, abs=1e-9)
    assert split["sd_nats_2x_documents"] == pytest.approx(split["sd_nats"])


def test_with_interaction_alone_twice_the_documents_halve_the_variance(tmp_path):
    rng = np.random.default_rng(1)
    seeds, docs = 40, 30
    diffs = rng.normal(0, 0.05, (seeds, docs))  # no seed effect: every seed's spread is seed x document
    write_evaluations(tmp_path, diffs, tokens=[200] * docs)
    split = seed_by_document(tmp_path, list(range(seeds)))
    assert 0.7 < split["interaction_share"] < 1.3
    assert split["sd_nats_2x_documents"] ** 2 == pytest.approx(
        split["sd_nats"] ** 2 - split["interaction_term"] / 2)


class Unplanned(torch.nn.Module):
    """The part of a PlannedLM that the optimiser reads: its parameters, and no adapter."""

    def __init__(self):
        super().__init__()
        self.lm, self.adapter = torch.nn.Linear(2, 2), None


def test_the_cosine_lever_decays_the_rate_to_zero_and_leaves_with_the_recipe():
    from planlm.train.lm_module import LightningLM

    module = LightningLM(Unplanned(), lr=1e-3, warmup_steps=4)
    module._trainer = SimpleNamespace(estimated_stepping_batches=20, precision="32-true")
    recipe = LightningLM.configure_optimizers
    with lever("cosine", ema_decay=0.99):
        schedule = module.configure_optimizers()["lr_scheduler"]["scheduler"]
        factors = [schedule.lr_lambdas[0](step) for step in range(20)]
    assert LightningLM.configure_optimizers is recipe
    assert factors[3] == pytest.approx(1.0) and factors[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(factors[3:], factors[4:]))  # falls after the warm-up
    constant = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    assert constant.lr_lambdas[0](19) == 1.0


def test_the_ema_lever_averages_into_a_whole_best_checkpoint(tmp_path):
    import lightning as L

    import planlm.train.lm as lm_stage
    from planlm.args import Runtime
    from planlm.train.lm import LMTrainConfig

    recipe = lm_stage.build_trainer
    with lever("ema", ema_decay=0.9):
        trainer, best = lm_stage.build_trainer(LMTrainConfig(), Runtime(device="cpu"), tmp_path, best_filename="b",
                                               log_folders={"csv": "logs", "tensorboard": "tb"})
    assert lm_stage.build_trainer is recipe
    assert any(isinstance(c, L.pytorch.callbacks.EMAWeightAveraging) for c in trainer.callbacks)
    assert best.save_weights_only is False  # so the callback's save hook puts the average in it
    plain, plain_best = recipe(LMTrainConfig(), Runtime(device="cpu"), tmp_path, best_filename="b",
                               log_folders={"csv": "logs", "tensorboard": "tb"})
    assert plain_best.save_weights_only is True
    assert not any(isinstance(c, L.pytorch.callbacks.EMAWeightAveraging) for c in plain.callbacks)
