"""The planner's dynamics g, and how g runs with the prediction f: one interface, the paper's recurrent g.

    z_{1:i+k}   = g(z_{1:i+k-1}, a_{i+k-1})   1 <= k < T   append Emb(action) to the latents
    p(a_{i+k})  = f(z_{1:i+k})                0 <= k < T

A ``Dynamics`` is g together with the ways the planner runs g and f after h:

    teacher_forcing   the logits of all T steps for given actions (training, evaluation)
    start, step       step-by-step decoding: the state after h with its step-0 logits, then one action
                      per row and step (the argmax path)
    sample            K sampled paths per boundary, batched the way this g allows (``sample_from``: the
                      same from a start state, which the greedy path and the sampled paths can share)

f is passed in rather than owned by g: the planner holds g as ``dynamics`` and f as ``prediction``,
the state-dict keys of every saved planner. Each g names the f it runs with (``prediction_class``).
Two implementations: ``RecurrentDynamics`` (the paper's, here: g re-encodes the grown set of latents
at every step, so every latent changes) and ``CausalDynamics`` (planlm.models.dynamics_causal: a
prefix-causal g and f with a key/value cache, which makes extra paths cheap).

Letters: B batch (boundaries), T horizon, K paths, A actions, D width (d_model), n latents in a
state, N rows of a state (B, or one per path or per distinct prefix), U distinct prefixes,
P paths in all (sum of the per-boundary counts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn


class PlannerFields(Protocol):
    """The fields of ``planlm.models.planner.PlannerConfig`` that the dynamics read: named here, so that the
    dynamics (which the planner builds) do not import the planner."""

    num_actions: int
    d_model: int
    num_heads: int
    num_layers: int
    dim_feedforward: int
    dropout: float
    encoder: Literal["boundary", "article"]


GRAD_SCALE = 0.5
"""Scale of the gradient that flows back through the recurrent g into earlier states (MuZero's 0.5)."""


def transformer(config: PlannerFields) -> nn.TransformerEncoder:
    """The transformer of g or f: post-norm layers, the paper's (nn.TransformerEncoderLayer's default)."""
    layer = nn.TransformerEncoderLayer(config.d_model, config.num_heads, config.dim_feedforward, config.dropout,
                                       batch_first=True)
    return nn.TransformerEncoder(layer, config.num_layers, enable_nested_tensor=False)


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity forward; multiplies the gradient by ``scale`` (MuZero's trick for the recurrent state)."""
    return x * scale + x.detach() * (1.0 - scale)


class Dynamics(nn.Module, ABC):
    """g, and how the planner runs g with f. Every method starts from h's output: latents (B, n, D),
    latent_mask (B, n) [True = a real latent] and slot (B,), the sentence slot of the first planned action."""

    prediction_class: type[nn.Module]
    """The f this g runs with; the planner builds it right after g (so parameters are created g, then f)."""
    mixed_path_counts: bool
    """Whether ``sample`` takes a different number of paths per boundary in one call; if not, the planner
    samples each distinct count as a batch of its own."""

    @abstractmethod
    def teacher_forcing(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor,
                        slot: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """actions (B, T) fed actions (step t sees actions < t) -> logits (B, T, A)."""

    def path_logits(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor, slot: torch.Tensor,
                    paths: torch.Tensor) -> torch.Tensor:
        """paths (B, K, T) -> logits (B, K, T, A): every step's distribution given its own path's earlier actions,
        with gradients (joint training differentiates the plans it samples). Here: teacher forcing on each
        boundary's latents repeated K times."""
        batch, num_paths, horizon = paths.shape
        logits = self.teacher_forcing(prediction, latents.repeat_interleave(num_paths, dim=0),
                                      latent_mask.repeat_interleave(num_paths, dim=0),
                                      slot.repeat_interleave(num_paths), paths.flatten(0, 1))  # (B*K, T, A)
        return logits.view(batch, num_paths, horizon, -1)

    def sample_logits(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor,
                      slot: torch.Tensor, num_paths: int, horizon: int, temperature: float,
                      generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``sample``'s paths (B, K, T) (the same draws) and the logits (B, K, T, A) each step was drawn from, with
        gradients (``path_logits``). Here: the paths without gradients, then ``path_logits``."""
        with torch.no_grad():
            paths = self.sample(prediction, latents, latent_mask, slot, num_paths, horizon, temperature, generator)
        return paths, self.path_logits(prediction, latents, latent_mask, slot, paths)

    @abstractmethod
    def start(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor, slot: torch.Tensor,
              horizon: int):
        """The decoding state after h (one row per boundary); its ``logits`` (B, A) are step 0's."""

    @abstractmethod
    def step(self, prediction: nn.Module, state, actions: torch.Tensor):
        """actions (N,), one per row of ``state`` -> the state one step later, with the next ``logits`` (N, A)."""

    def sample(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor, slot: torch.Tensor,
               num_paths: int | torch.Tensor, horizon: int, temperature: float,
               generator: torch.Generator | None, top_actions: int = 0):
        """Sampled action paths (B, K, T) at ``temperature`` > 0. ``num_paths``: one K, or (where
        ``mixed_path_counts``) a LongTensor (B,) of counts: then K is its maximum and the paths of boundary b
        beyond num_paths[b] are zero padding. With ``top_actions`` M > 0, also the distribution each step was
        drawn from, as its M most likely actions: (paths, step_actions (B, K, T, M) long, step_probs (B, K, T, M)
        (``top_distribution``); the draws are the same."""
        state = self.start(prediction, latents, latent_mask, slot, horizon)
        return self.sample_from(prediction, state, num_paths, temperature, generator, top_actions)

    @abstractmethod
    def sample_from(self, prediction: nn.Module, state, num_paths: int | torch.Tensor, temperature: float,
                    generator: torch.Generator | None, top_actions: int = 0):
        """``sample`` from a start state (``start``, one row per boundary, its horizon T): the same draws, without
        encoding the contexts again."""


def step_distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits (N, A) -> softmax(logits / temperature) (N, A) float32: the distribution a step is drawn from."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def top_of(probs: torch.Tensor, top_actions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """probs (N, A) -> its M = min(top_actions, A) most likely actions (N, M) long and their probabilities (N, M)."""
    top_probs, top_ids = probs.topk(min(top_actions, probs.shape[-1]), dim=-1)  # (N, M)
    return top_ids, top_probs


def top_distribution(logits: torch.Tensor, temperature: float, top_actions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (N, A) -> the M = min(top_actions, A) most likely actions of softmax(logits / temperature),
    (N, M) long, and their probabilities, (N, M) float32 (not renormalised: 1 - their sum is the mass left out;
    the plan sources renormalise them)."""
    return top_of(step_distribution(logits, temperature), top_actions)


class RecurrentPrediction(nn.Module):
    """f: transformer over the latents, mean pool over the valid ones, linear classifier over actions."""

    def __init__(self, config: PlannerFields):
        super().__init__()
        self.transformer = transformer(config)
        self.classifier = nn.Linear(config.d_model, config.num_actions)

    def forward(self, latents: torch.Tensor, latent_mask: torch.Tensor) -> torch.Tensor:
        """latents (N, n, D), latent_mask (N, n) -> logits (N, A)."""
        hidden = self.transformer(latents, src_key_padding_mask=~latent_mask)  # (N, n, D)
        weights = latent_mask.unsqueeze(-1).to(hidden.dtype)  # (N, n, 1)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)  # (N, D)
        return self.classifier(pooled)  # (N, A)


@dataclass
class RecurrentState:
    """The set of latents after some steps: latents (N, n, D), latent_mask (N, n), slot (N,) of the next
    action, logits (N, A) of the next action; horizon T of the paths it starts."""

    latents: torch.Tensor
    latent_mask: torch.Tensor
    slot: torch.Tensor
    logits: torch.Tensor
    horizon: int

    def select(self, rows: torch.Tensor) -> RecurrentState:
        """rows (U,) -> the state of those rows."""
        return RecurrentState(self.latents[rows], self.latent_mask[rows], self.slot[rows], self.logits[rows],
                              self.horizon)


class RecurrentDynamics(Dynamics):
    """The paper's g: append Emb(action) at the next sentence slot, then a transformer over the grown set.

    No key/value cache is possible (every latent changes), so decoding re-encodes the whole set each step;
    sampling shares the state of paths with a common prefix instead."""

    prediction_class = RecurrentPrediction
    mixed_path_counts = True

    def __init__(self, config: PlannerFields, positions: nn.Module):
        super().__init__()
        self.action_embedding = nn.Embedding(config.num_actions, config.d_model)
        self.transformer = transformer(config)
        self.positions = positions  # shared with h (sinusoidal: no parameters)
        self.grad_scale = GRAD_SCALE

    def forward(self, latents: torch.Tensor, latent_mask: torch.Tensor, actions: torch.Tensor, slot: torch.Tensor):
        """latents (N, n, D), latent_mask (N, n), actions (N,), slot (N,) -> latents (N, n+1, D), mask (N, n+1)."""
        latents = scale_gradient(latents, self.grad_scale)
        new = self.action_embedding(actions) + self.positions(slot)  # (N, D)
        latents = torch.cat([latents, new.unsqueeze(1)], dim=1)  # (N, n+1, D)
        latent_mask = torch.cat([latent_mask, torch.ones_like(latent_mask[:, :1])], dim=1)  # (N, n+1)
        return self.transformer(latents, src_key_padding_mask=~latent_mask), latent_mask

    def start(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor, slot: torch.Tensor,
              horizon: int) -> RecurrentState:
        return RecurrentState(latents, latent_mask, slot, prediction(latents, latent_mask), horizon)  # logits (B, A)

    def step(self, prediction: nn.Module, state: RecurrentState, actions: torch.Tensor) -> RecurrentState:
        latents, latent_mask = self(state.latents, state.latent_mask, actions, state.slot)  # (N, n+1, D)
        return RecurrentState(latents, latent_mask, state.slot + 1, prediction(latents, latent_mask), state.horizon)

    def teacher_forcing(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor,
                        slot: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        state = self.start(prediction, latents, latent_mask, slot, actions.shape[1])
        logits = [state.logits]
        for step in range(1, actions.shape[1]):
            state = self.step(prediction, state, actions[:, step - 1])
            logits.append(state.logits)
        return torch.stack(logits, dim=1)  # (B, T, A)

    def path_logits(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor, slot: torch.Tensor,
                    paths: torch.Tensor) -> torch.Tensor:
        """Paths that share a prefix share their state, as in sampling: g and f run once per distinct
        (boundary, prefix), U <= B*K rows a step, and each path reads its own state's logits."""
        batch, num_paths, horizon = paths.shape
        state = self.start(prediction, latents, latent_mask, slot, horizon)  # logits (B, A)
        flat = paths.flatten(0, 1)  # (P, T), P = B*K
        state_of_path = torch.arange(batch, device=paths.device).repeat_interleave(num_paths)  # (P,)
        logits = [state.logits[state_of_path]]
        for step in range(1, horizon):
            state, state_of_path = self._branch(prediction, state, state_of_path, flat[:, step - 1])
            logits.append(state.logits[state_of_path])  # (P, A)
        return torch.stack(logits, dim=1).view(batch, num_paths, horizon, -1)

    def sample_from(self, prediction: nn.Module, state: RecurrentState, num_paths: int | torch.Tensor,
                    temperature: float, generator: torch.Generator | None, top_actions: int = 0):
        batch_size, device = state.logits.shape[0], state.logits.device
        if torch.is_tensor(num_paths):
            counts = num_paths.to(device)
        else:
            counts = torch.full((batch_size,), num_paths, dtype=torch.long, device=device)
        paths, steps, _ = self._sample_shared_prefixes(prediction, state, counts, state.horizon, temperature,
                                                       generator, top_actions)
        most = int(counts.max())
        if int(counts.min()) == most:
            outputs = [x.view(batch_size, most, *x.shape[1:]) for x in (paths, *steps)]  # (B, K, T[, M])
        else:
            outputs = [pad_paths(x, counts, most) for x in (paths, *steps)]  # (B, K_max, T[, M])
        return tuple(outputs) if top_actions else outputs[0]

    def _sample_shared_prefixes(self, prediction: nn.Module, state: RecurrentState, counts: torch.Tensor,
                                horizon: int, temperature: float, generator: torch.Generator | None,
                                top_actions: int = 0, keep_logits: bool = False) -> tuple[torch.Tensor, tuple, torch.Tensor | None]:
        """counts (B,) paths per boundary -> the paths, boundary after boundary: (P, T); with ``top_actions``
        M the (step_actions, step_probs) (P, T, M) of each step's distribution (else ()); with ``keep_logits`` the
        logits (P, T, A) each step was drawn from (else None; with gradients where they are enabled).

        Paths that share a prefix share their state, so g and f run once per distinct (boundary, prefix):
        U <= P states. Each path samples from its own row of probabilities, so the draws are exactly those
        of independent rollouts."""
        state_of_path = torch.arange(len(counts), device=counts.device).repeat_interleave(counts)  # (P,)
        actions, step_ids, step_probs, logits = [], [], [], []
        for step in range(horizon):
            if step > 0:
                state, state_of_path = self._branch(prediction, state, state_of_path, actions[-1])
            if keep_logits:
                logits.append(state.logits[state_of_path])  # (P, A)
            probs = step_distribution(state.logits.detach(), temperature)  # (U, A)
            actions.append(torch.multinomial(probs[state_of_path], 1, generator=generator).squeeze(1))  # (P,)
            if top_actions:
                ids, top = top_of(probs, top_actions)  # (U, M)
                step_ids.append(ids[state_of_path])
                step_probs.append(top[state_of_path])
        steps = (torch.stack(step_ids, dim=1), torch.stack(step_probs, dim=1)) if top_actions else ()
        kept = torch.stack(logits, dim=1) if keep_logits else None  # (P, T, A)
        return torch.stack(actions, dim=1), steps, kept  # (P, T), ((P, T, M), (P, T, M)), (P, T, A)

    def _branch(self, prediction: nn.Module, state: RecurrentState, state_of_path: torch.Tensor,
                actions: torch.Tensor) -> tuple[RecurrentState, torch.Tensor]:
        """One step of paths that share states: state_of_path (P,) rows of ``state`` (U states), actions (P,) ->
        the state of each distinct (parent state, action), U' rows, and each path's row in it (P,)."""
        num_actions = state.logits.shape[-1]
        keys = state_of_path * num_actions + actions  # (P,)
        unique_keys, state_of_path = torch.unique(keys, return_inverse=True)  # (U',), (P,)
        return self.step(prediction, state.select(unique_keys // num_actions), unique_keys % num_actions), state_of_path

    def sample_logits(self, prediction: nn.Module, latents: torch.Tensor, latent_mask: torch.Tensor,
                      slot: torch.Tensor, num_paths: int, horizon: int, temperature: float,
                      generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """In one pass: the logits the draws were made from carry the gradients."""
        state = self.start(prediction, latents, latent_mask, slot, horizon)
        counts = torch.full((len(slot),), num_paths, dtype=torch.long, device=slot.device)
        paths, _, logits = self._sample_shared_prefixes(prediction, state, counts, horizon, temperature, generator,
                                                        keep_logits=True)
        batch = len(slot)
        return paths.view(batch, num_paths, horizon), logits.view(batch, num_paths, horizon, -1)


def pad_paths(paths: torch.Tensor, counts: torch.Tensor, most: int) -> torch.Tensor:
    """paths (P, T, ...), boundary after boundary -> (B, most, T, ...) with zero padding beyond each count."""
    starts = torch.cumsum(counts, 0) - counts  # (B,) first row of each boundary
    slot = torch.arange(len(paths), device=paths.device) - starts.repeat_interleave(counts)  # (P,) path index
    out = paths.new_zeros(len(counts), most, *paths.shape[1:])
    out[torch.arange(len(counts), device=paths.device).repeat_interleave(counts), slot] = paths
    return out
