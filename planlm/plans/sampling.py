"""Plans for every sentence boundary of a prepared split: the planner's contexts and targets, the
sampling loop (``compute_plans``) and the ``sample-plans`` command that fills the plan cache
(``planlm.plans.cache``).

Boundary s (split-global sentence index) is the point before sentence s; its context is the true
sentences of the same article before s (the last ``max_sentences`` of them) and its plan is the
actions of sentences s, s+1, ..., s+T-1. A planner with the article-level encoder reads article rows
(``article_rows``: one pass per article serves all its boundaries, the same contexts).

Letters: B boundaries, S context sentences, E embedding width, K paths, T horizon, N_sent sentences.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch

from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.plans.cache import default_plans_dir, expected_action_dtype, expected_mass
from planlm.plans.policy import PathPolicy, paths_summary, sample_with_policy
from planlm.plans.spec import PlanKind, PlanSpec
from planlm.models.dynamics import top_distribution
from planlm.models.planner import WEIGHTS_FILE, Planner
from planlm.utils import PlanlmError, autocast, file_sha256, prepare_stage_dir, resolve_device, write_manifest

IGNORE_INDEX = -100  # target of a step beyond the article's end (ignored by the loss)
MAX_ROWS = 4096  # most paths (B*K) per forward in compute_plans: bounds activation memory, keeps caches warm


def boundary_contexts(split: PreparedSplit, sentences: np.ndarray, max_sentences: int,
                      embeddings: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sentences (B,) boundaries -> context_embeds (B, S, E) float32, context_mask (B, S) bool (right-padded).

    The context of boundary s is the sentences of s's article before s, the last ``max_sentences`` of
    them; S is the longest context in the batch (0 when every boundary opens its article).
    ``embeddings`` replaces the split's cached embeddings (a planner that finetunes its encoder).
    """
    sentences = np.asarray(sentences, dtype=np.int64)
    embeddings = split.embeddings if embeddings is None else embeddings
    article_start = split.sentence_offsets[split.sentence_article[sentences]]  # (B,)
    begin = np.maximum(article_start, sentences - max_sentences)  # (B,)
    lengths = sentences - begin  # (B,)
    num_context = int(lengths.max()) if len(lengths) else 0
    positions = np.arange(num_context)
    context_mask = positions[None, :] < lengths[:, None]  # (B, S)
    index = np.where(context_mask, begin[:, None] + positions[None, :], 0)  # (B, S)
    width = embeddings.shape[1]
    context = np.asarray(embeddings[index.reshape(-1)], dtype=np.float32) if index.size else \
        np.zeros((0, width), dtype=np.float32)
    context = context.reshape(len(sentences), num_context, width) * context_mask[..., None]  # (B, S, E)
    return torch.from_numpy(context), torch.from_numpy(context_mask)


def article_rows(split: PreparedSplit, max_sentences: int) -> np.ndarray:
    """The article rows of a split: (R, 3) int64 of (first sentence, boundaries J, first supervised boundary).

    Row r holds sentences begin .. begin+J-2 and its boundaries j = 0 .. J-1 (boundary j: context = the row's
    first j sentences, i.e. global sentence begin+j). One row per article covers its first max_sentences + 1
    boundaries, every context as the paper's (the last max_sentences sentences). A longer article's later
    boundary s gets a row of its own, s-max_sentences .. s-1, supervised at its last boundary only: the same
    context as the per-boundary encoder, but every boundary of such a row runs its T-1 steps, about
    (max_sentences+1)*T tokens for one boundary where the per-boundary encoder takes max_sentences+T (articles
    longer than max_sentences + 1 sentences are where the article encoder is not yet faster)."""
    offsets = split.sentence_offsets
    rows = []
    for begin, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        if end > begin:
            rows.append((begin, min(end - begin, max_sentences + 1), 0))
            rows.extend((s - max_sentences, max_sentences + 1, max_sentences)
                        for s in range(begin + max_sentences + 1, end))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def article_contexts(split: PreparedSplit, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """rows (R, 3) of ``article_rows`` -> context_embeds (R, S, E) float32, context_mask (R, S) bool (a row's
    sentences, right-padded; S = J-1) and sentences (R, J) int64: the boundary (split-global sentence index) of
    each supervised row position, -1 elsewhere."""
    begin, num_bounds, first = np.asarray(rows, dtype=np.int64).reshape(-1, 3).T  # (R,) each
    bound = np.arange(int(num_bounds.max()) if len(num_bounds) else 1)  # (J,)
    supervised = (bound[None, :] >= first[:, None]) & (bound[None, :] < num_bounds[:, None])  # (R, J)
    sentences = np.where(supervised, begin[:, None] + bound[None, :], -1)  # (R, J)
    context_mask = bound[None, :-1] < num_bounds[:, None] - 1  # (R, S)
    index = np.where(context_mask, begin[:, None] + bound[None, :-1], 0)  # (R, S)
    context = np.asarray(split.embeddings[index.reshape(-1)], dtype=np.float32).reshape(*index.shape, -1)
    context = context * context_mask[..., None]  # (R, S, E)
    return torch.from_numpy(context), torch.from_numpy(context_mask), sentences


def boundary_targets(split: PreparedSplit, sentences: np.ndarray, horizon: int) -> torch.Tensor:
    """sentences (B,) -> target_actions (B, T) long: actions of s .. s+T-1, IGNORE_INDEX past the article's end."""
    sentences = np.asarray(sentences, dtype=np.int64)
    article_end = split.sentence_offsets[split.sentence_article[sentences] + 1]  # (B,)
    index = sentences[:, None] + np.arange(horizon)[None, :]  # (B, T)
    valid = index < article_end[:, None]  # (B, T)
    actions = np.asarray(split.actions[np.where(valid, index, 0).reshape(-1)]).reshape(index.shape)
    return torch.from_numpy(np.where(valid, actions, IGNORE_INDEX).astype(np.int64))


@torch.no_grad()
def embed_split(planner: Planner, split: PreparedSplit, batch_size: int = 64) -> np.ndarray:
    """(N_sent, E) embeddings of every sentence of the split by the planner's own (finetuned) encoder."""
    planner.eval()
    out = np.zeros((split.num_sentences, planner.config.embedding_dim), dtype=np.float32)
    for start in range(0, split.num_sentences, batch_size):
        texts = [split.sentence_text(s) for s in range(start, min(start + batch_size, split.num_sentences))]
        out[start:start + len(texts)] = planner.embed_sentences(texts).float().cpu().numpy()
    return out


def check_split(split: PreparedSplit, where: str) -> None:
    if split.num_sentences == 0:
        raise PlanlmError(f"{split.path}: split {split.name!r} has no sentences; prepare it with articles or "
                          f"leave it out of {where}")


@torch.no_grad()
def compute_plans(planner: Planner, split: PreparedSplit, num_paths: int, horizon: int, temperature: float,
                  seed: int, batch_size: int = 256, device: str = "cpu", sentences: np.ndarray | None = None,
                  out: np.ndarray | None = None, argmax_out: np.ndarray | None = None,
                  max_rows: int = MAX_ROWS, precision: str = "fp32", policy: PathPolicy | None = None,
                  num_paths_out: np.ndarray | None = None, top_actions: int = 0,
                  expected_out: tuple[np.ndarray, np.ndarray] | None = None,
                  argmax_expected_out: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Sampled paths for every boundary of ``split`` (or the given sentence indices) -> (N, K, T) int64.

    Boundaries are processed in order of context length (little padding), at most ``batch_size``
    boundaries and ``max_rows`` paths (B*K) per forward. Reproducible: one torch.Generator seeded with
    ``seed`` walks that fixed order (so the result depends on batch_size, max_rows and the device type,
    all part of the cache key). ``out`` and ``argmax_out`` ((N, T)) receive the results in place
    (e.g. memory-mapped files). ``precision`` (fp32, bf16 or auto) sets the planner's autocast.
    ``policy`` (default fixed) decides each boundary's number of paths, at most K = ``num_paths``;
    ``num_paths_out`` (N,) receives them (the paths of a row beyond its count are zero padding).
    With ``top_actions`` M (plans in expectation; fixed policy), ``expected_out`` (actions, probs) (N, K, T, M)
    receives the distribution each sampled step was drawn from and ``argmax_expected_out`` (N, T, M) the
    planner's distribution (tau 1) at each step of the greedy path (``planlm.plans.cache``); same draws.
    """
    check_split(split, "the plans")
    policy = (policy or PathPolicy()).resolve(num_paths)
    num_paths = policy.max_paths
    torch_device = resolve_device(device)
    planner = planner.to(torch_device).eval()
    sentences = np.arange(split.num_sentences) if sentences is None else np.asarray(sentences, dtype=np.int64)
    if out is None:
        out = np.zeros((len(sentences), num_paths, horizon), dtype=np.int64)
    embeddings = embed_split(planner, split) if planner.config.finetune_encoder else None
    generator = torch.Generator(device=torch_device).manual_seed(seed)
    if planner.config.encoder == "article" and (policy.kind == "fixed" or temperature == 0):
        _article_plans(planner, split, sentences, num_paths, horizon, temperature, generator,
                       max(1, min(batch_size, max_rows // num_paths)), precision, top_actions, out, argmax_out,
                       num_paths_out, expected_out, argmax_expected_out)
        return out
    context_lengths = sentences - split.sentence_offsets[split.sentence_article[sentences]]
    order = np.argsort(np.minimum(context_lengths, planner.config.max_sentences), kind="stable")
    per_forward = max(1, min(batch_size, max_rows // num_paths))
    for start in range(0, len(order), per_forward):
        rows = np.sort(order[start:start + per_forward])  # positions in ``sentences``
        batch = sentences[rows]
        context_embeds, context_mask = boundary_contexts(split, batch, planner.config.max_sentences, embeddings)
        context_embeds, context_mask = context_embeds.to(torch_device), context_mask.to(torch_device)
        with autocast(torch_device, precision):
            greedy = None
            if argmax_out is not None and top_actions and argmax_expected_out is not None:
                greedy, *steps = planner.expected_argmax_path(context_embeds, context_mask, horizon, top_actions)
                _write_rows(argmax_expected_out, rows, steps)  # (B, T, M) twice
            elif argmax_out is not None:
                greedy = planner.argmax_path(context_embeds, context_mask, horizon)  # (B, T)
            if greedy is not None:
                argmax_out[rows] = greedy.cpu().numpy()
            counts = torch.full((len(rows),), num_paths)
            if top_actions and expected_out is not None:
                paths, *steps = planner.sample_expected_paths(context_embeds, context_mask, num_paths, horizon,
                                                              temperature, top_actions, generator)
                _write_rows(expected_out, rows, steps)  # (B, K, T, M) twice
            elif temperature == 0 and greedy is not None:  # every path is the greedy one: no second rollout
                paths = greedy[:, None].expand(-1, num_paths, -1)
            else:
                paths, counts = sample_with_policy(planner, context_embeds, context_mask, policy, horizon,
                                                   temperature, generator)
            out[rows] = paths.cpu().numpy()  # (B, K, T)
            if num_paths_out is not None:
                num_paths_out[rows] = counts.cpu().numpy()  # (B,)
    return out


def _article_plans(planner: Planner, split: PreparedSplit, sentences: np.ndarray, num_paths: int, horizon: int,
                   temperature: float, generator: torch.Generator, per_forward: int, precision: str,
                   top_actions: int, out: np.ndarray, argmax_out: np.ndarray | None, num_paths_out: np.ndarray | None,
                   expected_out: tuple | None, argmax_expected_out: tuple | None) -> None:
    """``compute_plans`` for the article-level encoder (fixed policy): article rows of about ``per_forward``
    boundaries, one causal pass per row, then the paths of every asked-for boundary from that pass."""
    device = next(planner.parameters()).device
    position = np.full(split.num_sentences, -1, dtype=np.int64)
    position[sentences] = np.arange(len(sentences))  # boundary -> its row in ``out``
    rows = article_rows(split, planner.config.max_sentences)
    begin, num_bounds, first = rows.T
    asked = np.array([(position[b + f:b + j] >= 0).sum() for b, j, f in rows])  # (rows,) boundaries asked for
    rows, asked = rows[asked > 0], asked[asked > 0]
    batch_of = np.cumsum(asked) // per_forward if len(rows) else asked  # consecutive rows of ~per_forward boundaries
    for batch in np.unique(batch_of):
        context_embeds, context_mask, row_sentences = article_contexts(split, rows[batch_of == batch])
        wanted = row_sentences >= 0
        wanted[wanted] = position[row_sentences[wanted]] >= 0  # (R, J)
        row, bound = (torch.from_numpy(x).to(device) for x in np.nonzero(wanted))
        targets = position[row_sentences[wanted]]  # (B,) rows of ``out``, in the order of (row, bound)
        with autocast(device, precision):
            state = planner.article_start(context_embeds.to(device), context_mask.to(device), row, bound, horizon)
            greedy = None
            if argmax_out is not None or temperature == 0:
                logits, greedy = planner.decode(state, horizon)  # (B, T, A), (B, T)
                if argmax_out is not None:
                    argmax_out[targets] = greedy.cpu().numpy()
                if argmax_out is not None and top_actions and argmax_expected_out is not None:
                    ids, probs = top_distribution(logits.flatten(0, 1), 1.0, top_actions)  # (B*T, M)
                    _write_rows(argmax_expected_out, targets, [ids.view(*greedy.shape, -1), probs.view(*greedy.shape, -1)])
            if temperature == 0:
                paths = greedy[:, None].expand(-1, num_paths, -1)
                if top_actions and expected_out is not None:  # the distribution at tau 0 is the greedy action itself
                    _write_rows(expected_out, targets, [paths.unsqueeze(-1), torch.ones(*paths.shape, 1)])
            elif top_actions and expected_out is not None:
                paths, *steps = planner.dynamics.sample_from(planner.prediction, state, num_paths, temperature,
                                                             generator, top_actions)
                _write_rows(expected_out, targets, steps)  # (B, K, T, M) twice
            else:
                paths = planner.dynamics.sample_from(planner.prediction, state, num_paths, temperature, generator)
        out[targets] = paths.cpu().numpy()  # (B, K, T)
        if num_paths_out is not None:
            num_paths_out[targets] = num_paths


def _write_rows(arrays: tuple[np.ndarray, ...], rows: np.ndarray, values: list[torch.Tensor]) -> None:
    for array, value in zip(arrays, values):
        array[rows] = value.float().cpu().numpy() if value.is_floating_point() else value.cpu().numpy()


def sample_plans(planner_dir: str, prepared_dir: str, splits: Optional[list[str]] = None, num_paths: int = 10,
                 horizon: Optional[int] = None, temperature: float = 1.0, seed: int = 0,
                 out_dir: Optional[str] = None, batch_size: int = 256, device: str = "auto",
                 precision: Literal["auto", "fp32", "bf16"] = "auto", path_policy: PathPolicy = PathPolicy(),
                 expectation: bool = False, top_actions: int = 64) -> Path:
    """Sample K action paths of T steps for every sentence boundary and cache them on disk.

    Each boundary's paths come from the true text before it. The cache folder is keyed by the planner's
    weights (sha256), the prepared corpus, K, T, tau, seed, batch size, device type, precision and the path
    policy; rerunning with the same key reuses it, a different key recomputes it.

    Args:
        planner_dir: Folder of a trained planner (``planlm train-planner``).
        prepared_dir: Prepared corpus whose boundaries get plans (same codebook as the planner's).
        splits: Splits to cover; default: every split of the prepared corpus.
        num_paths: K, sampled paths per boundary (the most any boundary gets under an adaptive path policy).
        horizon: T, actions per path; default: the planner's trained horizon.
        temperature: Softmax temperature tau (0 = argmax, every path the greedy one).
        seed: Seed of the sampling generator.
        out_dir: Cache folder; default ``<planner_dir>/plans/K{K}-T{T}-tau{tau}-seed{seed}`` (plus the policy).
        batch_size: Boundaries per forward pass.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1`` ...
        precision: The planner's arithmetic: auto (bf16 autocast on CUDA, fp32 on CPU), fp32 or bf16.
        path_policy: Paths per boundary: fixed (K everywhere), entropy or converge (planlm.plans.policy).
        expectation: Also store the distribution of every step (plans in expectation, ``--plans.expectation``):
            its ``top_actions`` most likely actions and their probabilities, for the sampled and the argmax paths.
        top_actions: With expectation: actions kept per step (>= the number of actions keeps all; the stored
            probabilities are float16, within about 2e-3 of the planner's).

    Returns:
        The plan cache folder.
    """
    prepared = PreparedDataset(prepared_dir)
    planner = Planner.for_corpus(planner_dir, prepared)
    horizon = planner.config.horizon if horizon is None else horizon
    _check_sampling(num_paths, horizon, temperature, batch_size)
    policy = path_policy.resolve(num_paths)
    if expectation:  # one line for a policy or a top_actions no expected plan can have
        PlanSpec(kind=PlanKind.planner_sampled, expectation=True, top_actions=top_actions, num_paths=num_paths,
                 path_policy=policy).resolve()
    num_paths = policy.max_paths
    splits = list(prepared.manifest.get("splits", ["train", "validation", "test"])) if splits is None else splits
    split_views = {name: prepared.split(name) for name in splits}
    for split in split_views.values():
        check_split(split, "--splits")
    expected = top_actions if expectation else 0
    out = Path(out_dir) if out_dir else default_plans_dir(planner_dir, num_paths, horizon, temperature, seed, policy,
                                                          expected)
    planner_hash = file_sha256(Path(planner_dir) / WEIGHTS_FILE)
    torch_device = resolve_device(device)
    config = {"planner_hash": planner_hash, "prepared_dir": str(Path(prepared_dir).resolve()),
              "codebook_hash": prepared.codebook_hash, "num_paths": num_paths, "horizon": horizon,
              "temperature": temperature, "seed": seed, "splits": splits, "batch_size": batch_size, "max_rows": MAX_ROWS,
              "device_type": torch_device.type, "precision": precision}
    if policy.adaptive:  # fixed keeps the key of the caches made before policies existed
        config["path_policy"] = policy.cache_key()
    if expected:  # sampled actions alone keep the key of the caches made before expectation existed
        config["expectation"] = {"top_actions": expected}
    if prepare_stage_dir(out, config):
        return out
    counts, paths, planner_time, kept = {}, {}, {}, {}
    for name, split in split_views.items():
        began = time.perf_counter()
        paths[name] = _sample_split(planner, split, out, num_paths, horizon, temperature, seed, batch_size,
                                    torch_device, precision, policy, expected)
        planner_time[name] = time.perf_counter() - began
        counts[name] = split.num_sentences
        if expected:
            kept[name] = expected_mass(out, name)
    write_manifest(out, config, num_paths=num_paths, horizon=horizon, temperature=temperature, seed=seed,
                   planner_hash=planner_hash, planner_dir=str(Path(planner_dir).resolve()),
                   codebook_hash=prepared.codebook_hash, num_actions=prepared.num_actions,
                   prepared_dir=str(Path(prepared_dir).resolve()), splits=splits, counts=counts,
                   path_policy=asdict(policy), paths=paths, planner_time_s=planner_time,
                   expectation={"top_actions": expected, "kept": kept} if expected else None)
    return out


def _check_sampling(num_paths: int, horizon: int, temperature: float, batch_size: int) -> None:
    if num_paths < 1:
        raise PlanlmError(f"sample-plans: --num_paths={num_paths} must be >= 1")
    if horizon < 1:
        raise PlanlmError(f"sample-plans: --horizon={horizon} must be >= 1")
    if temperature < 0:
        raise PlanlmError(f"sample-plans: --temperature={temperature} must be >= 0 (0 = argmax)")
    if batch_size < 1:
        raise PlanlmError(f"sample-plans: --batch_size={batch_size} must be >= 1")


def _sample_split(planner: Planner, split: PreparedSplit, out: Path, num_paths: int, horizon: int,
                  temperature: float, seed: int, batch_size: int, device: torch.device, precision: str,
                  policy: PathPolicy, top_actions: int = 0) -> dict:
    """Write one split's sampled paths, their counts and argmax paths (with ``top_actions``, also the
    distribution of every step of both) into the cache; return its paths summary."""
    def array(name: str, shape: tuple, dtype=np.int64) -> np.ndarray:
        return np.lib.format.open_memmap(out / f"{split.name}.{name}npy", mode="w+", dtype=dtype, shape=shape)

    sampled = array("", (split.num_sentences, num_paths, horizon))
    greedy = array("argmax.", (split.num_sentences, horizon))
    expected = argmax_expected = None
    if top_actions:
        kept = min(top_actions, planner.config.num_actions)
        ids = expected_action_dtype(planner.config.num_actions)
        expected = tuple(array(f"expected_{part}.", (split.num_sentences, num_paths, horizon, kept), dtype)
                         for part, dtype in (("actions", ids), ("probs", np.float16)))
        argmax_expected = tuple(array(f"argmax.expected_{part}.", (split.num_sentences, horizon, kept), dtype)
                                for part, dtype in (("actions", ids), ("probs", np.float16)))
    path_counts = np.zeros(split.num_sentences, dtype=np.int64)
    compute_plans(planner, split, num_paths, horizon, temperature, seed, batch_size=batch_size, device=str(device),
                  out=sampled, argmax_out=greedy, precision=precision, policy=policy, num_paths_out=path_counts,
                  top_actions=top_actions, expected_out=expected, argmax_expected_out=argmax_expected)
    for written in (sampled, greedy, *(expected or ()), *(argmax_expected or ())):
        written.flush()
    del sampled, greedy, expected, argmax_expected
    np.save(out / f"{split.name}.num_paths.npy", path_counts)
    return paths_summary(path_counts, num_paths)
