"""The planner's final evaluation: per-step top-1/top-5/NLL of the planner (teacher-forced and
free-running) beside majority, unigram and bigram baselines, the planner's information (what it knows
about each step's action beyond the action frequencies), and the summary files that hold them.

Letters: B boundaries, T horizon, A actions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from planlm.data.artifacts import PreparedSplit
from planlm.jsonio import write_json
from planlm.models.planner import Planner
from planlm.plans.contexts import IGNORE_INDEX, boundary_contexts, boundary_targets, embed_split

SUMMARY_MODELS = ("planner_teacher_forced", "planner_free_running", "majority", "unigram", "bigram")


def _empty_metrics(horizon: int) -> dict[str, np.ndarray]:
    return {name: np.zeros(horizon) for name in ("top1", "top5", "nll", "count")}


def _accumulate(metrics: dict, log_probs: torch.Tensor, targets: torch.Tensor) -> None:
    """log_probs (B, T, A) (or None for NLL-less), targets (B, T) with IGNORE_INDEX."""
    valid = targets != IGNORE_INDEX  # (B, T)
    safe = targets.clamp(min=0)
    top5 = log_probs.topk(min(5, log_probs.shape[-1]), dim=-1).indices  # (B, T, 5)
    metrics["top1"] += ((top5[..., 0] == safe) & valid).sum(0).cpu().numpy()
    metrics["top5"] += ((top5 == safe.unsqueeze(-1)).any(-1) & valid).sum(0).cpu().numpy()
    nll = -log_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (B, T)
    metrics["nll"] += (nll * valid).sum(0).cpu().numpy()
    metrics["count"] += valid.sum(0).cpu().numpy()


def _finish(metrics: dict, with_nll: bool = True) -> dict[str, list]:
    count = np.maximum(metrics["count"], 1)
    return {"top1": (metrics["top1"] / count).tolist(), "top5": (metrics["top5"] / count).tolist(),
            "nll": (metrics["nll"] / count).tolist() if with_nll else None, "count": metrics["count"].astype(int).tolist()}


@torch.no_grad()
def evaluate_planner(planner: Planner, split: PreparedSplit, horizon: int, batch_size: int = 512,
                     device: str | torch.device = "cpu", sentences: np.ndarray | None = None) -> dict[str, dict]:
    """Per-step top-1/top-5/NLL of the planner on every boundary of ``split`` (or the given ones),
    teacher-forced and free-running."""
    planner = planner.to(device).eval()
    embeddings = embed_split(planner, split) if planner.config.finetune_encoder else None
    teacher, free = _empty_metrics(horizon), _empty_metrics(horizon)
    boundaries = np.arange(split.num_sentences) if sentences is None else np.asarray(sentences, dtype=np.int64)
    context_lengths = boundaries - split.sentence_offsets[split.sentence_article[boundaries]]
    boundaries = boundaries[np.argsort(context_lengths, kind="stable")]  # little padding per batch
    for start in range(0, len(boundaries), batch_size):
        sentences = boundaries[start:start + batch_size]
        context_embeds, context_mask = boundary_contexts(split, sentences, planner.config.max_sentences, embeddings)
        context_embeds, context_mask = context_embeds.to(device), context_mask.to(device)
        targets = boundary_targets(split, sentences, horizon).to(device)  # (B, T)
        logits, _ = planner.rollout(context_embeds, context_mask, horizon, targets)  # (B, T, A)
        _accumulate(teacher, logits.float().log_softmax(-1), targets)
        free_logits, _ = planner.rollout(context_embeds, context_mask, horizon)
        _accumulate(free, free_logits.float().log_softmax(-1), targets)
    return {"planner_teacher_forced": _finish(teacher), "planner_free_running": _finish(free)}


def baseline_metrics(train_split: PreparedSplit, eval_split: PreparedSplit, horizon: int, num_actions: int,
                     batch_size: int = 512) -> dict[str, dict]:
    """Majority, unigram and bigram baselines fitted on ``train_split``, scored per step on ``eval_split``.

    - majority: always the most frequent train action (a point mass: no NLL);
    - unigram: train action frequencies (add-one smoothed);
    - bigram: Markov chain p(a_next | a_prev) over consecutive sentences of train articles (add-one
      smoothed). Step k of boundary s is predicted from the last known action a_{s-1} as row a_{s-1}
      of P^(k+1); a boundary opening its article starts from the unigram: unigram @ P^k.
    """
    train_actions = np.asarray(train_split.actions)
    counts = np.bincount(train_actions, minlength=num_actions).astype(np.float64)
    unigram = torch.from_numpy((counts + 1) / (counts.sum() + num_actions))  # (A,)
    first = np.zeros(len(train_actions), dtype=bool)
    first[train_split.sentence_offsets[:-1][np.diff(train_split.sentence_offsets) > 0]] = True
    nexts = np.flatnonzero(~first)
    pair_counts = np.zeros((num_actions, num_actions))
    np.add.at(pair_counts, (train_actions[nexts - 1], train_actions[nexts]), 1)
    transition = torch.from_numpy((pair_counts + 1) / (pair_counts + 1).sum(1, keepdims=True))  # (A, A)
    powers = [torch.eye(num_actions, dtype=torch.float64)]
    for _ in range(horizon):
        powers.append(powers[-1] @ transition)  # powers[j] = P^j
    majority_order = torch.from_numpy(np.argsort(-counts, kind="stable"))

    metrics = {name: _empty_metrics(horizon) for name in ("majority", "unigram", "bigram")}
    eval_actions = np.asarray(eval_split.actions)
    eval_first = np.zeros(len(eval_actions), dtype=bool)
    eval_first[eval_split.sentence_offsets[:-1][np.diff(eval_split.sentence_offsets) > 0]] = True
    for start in range(0, eval_split.num_sentences, batch_size):
        sentences = np.arange(start, min(start + batch_size, eval_split.num_sentences))
        targets = boundary_targets(eval_split, sentences, horizon)  # (B, T)
        batch = len(sentences)
        unigram_log = unigram.log().expand(batch, horizon, -1)  # (B, T, A)
        _accumulate(metrics["unigram"], unigram_log, targets)
        # The majority "distribution": rank by train frequency (top-5 = five most frequent).
        majority_scores = torch.empty(num_actions, dtype=torch.float64)
        majority_scores[majority_order] = -torch.arange(num_actions, dtype=torch.float64)
        _accumulate(metrics["majority"], majority_scores.expand(batch, horizon, -1), targets)
        starts = torch.from_numpy(eval_first[sentences])  # (B,)
        previous = torch.from_numpy(eval_actions[np.maximum(sentences - 1, 0)])  # (B,)
        bigram = torch.stack([torch.where(starts.unsqueeze(-1), unigram @ powers[step], powers[step + 1][previous])
                              for step in range(horizon)], dim=1)  # (B, T, A)
        _accumulate(metrics["bigram"], bigram.log(), targets)
    return {"majority": _finish(metrics["majority"], with_nll=False), "unigram": _finish(metrics["unigram"]),
            "bigram": _finish(metrics["bigram"])}


def planner_information(metrics: dict[str, dict]) -> Optional[dict]:
    """Per horizon step, what the planner knows about the action: unigram NLL - planner NLL, in nats.

    The unigram NLL (train frequencies scored on the evaluation split) is the action's cross-entropy with
    no context, about its entropy; ``share`` is the information's fraction of it (0: the planner knows no
    more than the frequencies; 1: it names every action). Teacher-forced and free-running rollouts each get
    ``nats`` and ``share`` (T,). None when the metrics lack the unigram or a planner NLL."""
    unigram = (metrics.get("unigram") or {}).get("nll")
    if unigram is None:
        return None
    out = {"unigram_nll": list(unigram)}
    for rollout, name in (("teacher_forced", "planner_teacher_forced"), ("free_running", "planner_free_running")):
        nll = (metrics.get(name) or {}).get("nll")
        if nll is None:
            return None
        nats = [u - p for u, p in zip(unigram, nll)]
        out[rollout] = {"nats": nats, "share": [n / u if u > 0 else 0.0 for n, u in zip(nats, unigram)]}
    return out


def held_out_information(planner_dir: str | Path, prepared_dir: str | Path, split: str = "test",
                         train_split: Optional[str] = None, batch_size: int = 512) -> Optional[dict]:
    """``planner_information`` of a trained planner on ``split``, its baselines fitted on ``train_split`` (None: the
    corpus's planner split). Published tables use the test split: the validation split chose the planner's
    checkpoint (its lowest validation loss), so information measured there is biased upward."""
    from planlm.data.artifacts import PreparedDataset

    planner = Planner.from_pretrained(planner_dir)
    prepared = PreparedDataset(prepared_dir)
    evaluation = prepared.split(split)
    horizon = planner.config.horizon
    metrics = evaluate_planner(planner, evaluation, horizon, batch_size)
    metrics.update(baseline_metrics(prepared.split(train_split or prepared.planner_split), evaluation, horizon,
                                    prepared.num_actions))
    return planner_information(metrics)


def information_lines(information: dict) -> list[str]:
    """The markdown table of ``planner_information``: one row per horizon step."""
    lines = ["| step | unigram NLL | information, teacher-forced (share) | information, free-running (share) |",
             "|---|---|---|---|"]
    teacher, free = information["teacher_forced"], information["free_running"]
    for step, unigram in enumerate(information["unigram_nll"]):
        lines.append(f"| {step + 1} | {unigram:.3f} | {teacher['nats'][step]:+.3f} ({100 * teacher['share'][step]:.1f}%) "
                     f"| {free['nats'][step]:+.3f} ({100 * free['share'][step]:.1f}%) |")
    return lines


def write_summary(out_dir: Path, summary: dict) -> None:
    """summary.json (with the planner's information per step) and summary.md in ``out_dir``."""
    summary = {**summary, "information": planner_information(summary["metrics"])}
    write_json(out_dir / "summary.json", summary)
    lines = [f"# Planner summary: {summary['eval_split']} split of {summary['prepared_dir']}", "",
             f"{summary['num_boundaries']} boundaries, horizon T = {summary['horizon']}, "
             f"{summary['num_actions']} actions, {summary['dynamics']} dynamics g. Baselines fitted "
             f"on the {summary['train_split']} split. "
             "Teacher-forced: true actions fed to g; free-running: the planner's own argmax actions.", ""]
    names = [name for name in SUMMARY_MODELS if name in summary["metrics"]]
    for metric, title in (("top1", "Top-1 accuracy"), ("top5", "Top-5 accuracy"), ("nll", "NLL (nats)")):
        lines += [f"## {title} per step", "", "| step | boundaries | " + " | ".join(names) + " |",
                  "|---" * (len(names) + 2) + "|"]
        for step in range(summary["horizon"]):
            cells = []
            for name in names:
                values = summary["metrics"][name][metric]
                cells.append("n/a" if values is None else f"{values[step]:.4f}")
            count = summary["metrics"][names[0]]["count"][step]
            lines.append(f"| {step + 1} | {count} | " + " | ".join(cells) + " |")
        lines.append("")
    if summary["information"]:
        lines += ["## Information per step (nats: unigram NLL - planner NLL; share of the unigram NLL)", "",
                  *information_lines(summary["information"]), ""]
    (out_dir / "summary.md").write_text("\n".join(lines))
