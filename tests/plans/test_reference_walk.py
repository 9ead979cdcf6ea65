"""sample-plans against a plain reference walk built from the planner's parts (h, the dynamics' start and step, a
softmax and torch.multinomial): every array of the cache (sampled paths, path counts, argmax paths, step
distributions) is bit for bit the reference's, under the fixed and the entropy path policy and in expectation, for
both dynamics. A change to the walk's order, its batches or its use of the random generator fails here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.models.dynamics import top_distribution
from planlm.models.planner import Planner
from planlm.plans.config import PlanConfig
from planlm.plans.contexts import MAX_ROWS, boundary_contexts
from planlm.plans.policy import PathPolicy, entropy_num_paths
from planlm.plans.sampling import sample_plans

from helpers import tiny_planner

NUM_PATHS, HORIZON, TEMPERATURE, BATCH_SIZE = 3, 3, 0.5, 16
ENTROPY_HIGH = {"causal": 2.2, "recurrent": 1.45}  # about twice the tiny planners' median entropy: K = 2 or 3


def plan_settings(variant: str, dynamics: str) -> dict:
    if variant == "entropy":
        return {"path_policy": PathPolicy("entropy", 1, entropy_high=ENTROPY_HIGH[dynamics])}
    return {"expectation": variant == "expectation"}


def start(planner, context, mask):
    latents, latent_mask, slot = planner.representation(context, mask)
    return planner.dynamics.start(planner.prediction, latents, latent_mask, slot, HORIZON)


def greedy_logits(planner, state) -> torch.Tensor:
    """(B, T, A): each step's logits, feeding g the argmax action of the step before."""
    logits = [state.logits]
    for _ in range(1, HORIZON):
        state = planner.dynamics.step(planner.prediction, state, logits[-1].argmax(-1))
        logits.append(state.logits)
    return torch.stack(logits, dim=1)


def sample(planner, state, counts: torch.Tensor, rng, top_actions: int) -> tuple[torch.Tensor, list]:
    """counts (B,) paths per boundary -> (P, T) paths, boundary after boundary, and each step's top actions and their
    probabilities (P, T, M) when ``top_actions``: each path draws every step from its own state's distribution."""
    num_actions = state.logits.shape[-1]
    actions, steps = [], []
    if planner.config.dynamics == "causal":  # K draws of the shared first step, then one state per path
        num_paths = int(counts[0])
        probs = torch.softmax(state.logits.float() / TEMPERATURE, -1)
        actions.append(torch.multinomial(probs, num_paths, replacement=True, generator=rng).reshape(-1))
        steps.append([x.repeat_interleave(num_paths, 0) for x in top_distribution(state.logits, TEMPERATURE,
                                                                                  top_actions)])
        state = state.repeat_paths(num_paths)
        for _ in range(1, HORIZON):
            state = planner.dynamics.step(planner.prediction, state, actions[-1])
            probs = torch.softmax(state.logits.float() / TEMPERATURE, -1)
            actions.append(torch.multinomial(probs, 1, replacement=True, generator=rng)[:, 0])
            steps.append(top_distribution(state.logits, TEMPERATURE, top_actions))
    else:  # recurrent: one state per distinct (boundary, prefix)
        state_of_path = torch.arange(len(counts)).repeat_interleave(counts)
        for step in range(HORIZON):
            if step:
                unique, state_of_path = torch.unique(state_of_path * num_actions + actions[-1], return_inverse=True)
                state = planner.dynamics.step(planner.prediction, state.select(unique // num_actions),
                                              unique % num_actions)
            probs = torch.softmax(state.logits.float() / TEMPERATURE, -1)[state_of_path]
            actions.append(torch.multinomial(probs, 1, generator=rng)[:, 0])
            steps.append([x[state_of_path] for x in top_distribution(state.logits, TEMPERATURE, top_actions)])
    return torch.stack(actions, 1), [torch.stack(x, 1) for x in zip(*steps)]


@torch.no_grad()
def reference_walk(planner, split, plans: PlanConfig) -> dict[str, np.ndarray]:
    """The cache's arrays of ``split`` by name, drawn boundary batch after boundary batch: boundaries sorted by their
    context length, ``BATCH_SIZE`` at a time, each batch's greedy path and then its K sampled paths."""
    num, max_sentences, top = split.num_sentences, planner.config.max_sentences, plans.top_actions
    begins = split.sentence_offsets[split.sentence_article[np.arange(num)]]
    order = np.argsort(np.minimum(np.arange(num) - begins, max_sentences), kind="stable")
    out = {"npy": np.zeros((num, NUM_PATHS, HORIZON), np.int64), "num_paths.npy": np.zeros(num, np.int64),
           "argmax.npy": np.zeros((num, HORIZON), np.int64)}
    for name, shape in (("", (num, NUM_PATHS, HORIZON)), ("argmax.", (num, HORIZON))):
        top_shape = (*shape, min(top, planner.config.num_actions))  # A = 8: every action kept
        out[f"{name}expected_actions.npy"] = np.zeros(top_shape, np.int16)
        out[f"{name}expected_probs.npy"] = np.zeros(top_shape, np.float16)
    rng = torch.Generator().manual_seed(plans.seed)
    per_forward = min(BATCH_SIZE, MAX_ROWS // NUM_PATHS)
    for first in range(0, num, per_forward):
        rows = np.sort(order[first:first + per_forward])
        context, mask = boundary_contexts(split, rows, max_sentences)
        state = start(planner, context, mask)
        logits = greedy_logits(planner, state)  # (B, T, A)
        out["argmax.npy"][rows] = logits.argmax(-1).numpy()
        ids, probs = top_distribution(logits.flatten(0, 1), 1.0, top)
        out["argmax.expected_actions.npy"][rows] = ids.view(len(rows), HORIZON, -1).numpy()
        out["argmax.expected_probs.npy"][rows] = probs.view(len(rows), HORIZON, -1).numpy()
        if not plans.path_policy.adaptive:
            counts = torch.full((len(rows),), NUM_PATHS)
            paths, steps = sample(planner, state, counts, rng, top)
            out["npy"][rows] = paths.view(len(rows), NUM_PATHS, HORIZON).numpy()
            for name, x in zip(("expected_actions.npy", "expected_probs.npy"), steps):
                out[name][rows] = x.view(len(rows), NUM_PATHS, HORIZON, -1).numpy()
        else:
            counts = entropy_num_paths(state.logits, plans.path_policy, TEMPERATURE)
            if planner.config.dynamics == "causal":  # one batch per distinct count, its contexts encoded anew
                for count in torch.unique(counts).tolist():
                    group = torch.nonzero(counts == count)[:, 0]
                    paths, _ = sample(planner, start(planner, context[group], mask[group]),
                                      torch.full((len(group),), count), rng, top)
                    out["npy"][rows[group.numpy()], :count] = paths.view(len(group), count, HORIZON).numpy()
            else:
                paths, _ = sample(planner, state, counts, rng, top)
                path_rows = torch.arange(len(rows)).repeat_interleave(counts)
                slot = torch.arange(len(paths)) - (torch.cumsum(counts, 0) - counts).repeat_interleave(counts)
                out["npy"][rows[path_rows.numpy()], slot.numpy()] = paths.numpy()
        out["num_paths.npy"][rows] = counts.numpy()
    return out


@pytest.mark.parametrize("dynamics", ["causal", "recurrent"])
@pytest.mark.parametrize("variant", ["fixed", "entropy", "expectation"])
def test_sample_plans_draws_exactly_the_reference_walk(synthetic_cycle, tmp_path, dynamics, variant):
    prepared = PreparedDataset(synthetic_cycle)
    folder = tiny_planner(prepared, max_sentences=4, dynamics=dynamics, horizon=HORIZON).save_pretrained(
        tmp_path / "planner")
    plans = PlanConfig(kind="planner_sampled", planner_dir=str(folder), num_paths=NUM_PATHS, horizon=HORIZON,
                       temperature=TEMPERATURE, seed=3, **plan_settings(variant, dynamics))
    cache = sample_plans(str(synthetic_cycle), plans, splits=["validation", "test"], batch_size=BATCH_SIZE,
                         runtime=Runtime(device="cpu"), out_dir=str(tmp_path / "plans"))
    planner = Planner.from_pretrained(folder).eval()
    for name in ("validation", "test"):
        expected = reference_walk(planner, prepared[name], plans.resolve())
        written = sorted(path.name for path in cache.glob(f"{name}.*npy"))
        assert len(written) == (7 if variant == "expectation" else 3)
        for file in written:
            array = np.load(cache / file)
            np.testing.assert_array_equal(array, expected[file[len(name) + 1:]], err_msg=file, strict=True)
        if variant == "entropy":
            assert len(np.unique(expected["num_paths.npy"])) > 1  # the policy gives the boundaries different K
