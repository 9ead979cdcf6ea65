"""Perplexity of a (planned) LM on a prepared split: the reference protocol and its faster variants.

Reference protocol (the predecessor's, Cornille et al.): every token of an article but its first (it has no context) is
scored with up to 127 tokens of in-article context, i.e. by the last position of a stride-1 window
of at most 128 tokens. ``--stride S`` scores S tokens per 128-token window; ``--stride 128`` gives
plain non-overlapping windows. PPL = exp(total NLL / scored tokens).

How the windows are computed (exact, batched):

- Window w of an article covers tokens [start, end) and scores the targets [first, end). The LM
  reads tokens [start, end - 1) (the last token is only a target) and only the logits of the last
  ``end - first`` positions are computed (``PlannedLM.token_nll``): the vocabulary projection is the
  most expensive part of a small LM, and stride 1 needs one position of 127. Those logits are computed a chunk of positions at a time,
  never all at once (``planlm.models.lm_loss``, the training's default chunk).
- The first window of an article scores all of its targets at once: with a causal LM, target t of
  window [a0, a0 + 128) sees exactly the tokens [a0, t), the same as its own stride-1 window.
- Windows are grouped by (input length, scored positions), so a batch needs no padding (no
  attention mask, no position ids to fix) and many windows share one forward pass.
- A plan vector per sentence is computed *once* for the whole evaluation (planner paths -> adapter),
  then gathered onto tokens (``plan_embeds``): the LM runs once per window whatever K is.
- At each boundary the planner sees only the true sentences before it (``planlm.plans.kinds``).
- Beside each window's sum, its NLL per cell of ``planlm.evaluate.positions`` (the token's position in its
  sentence x how much of its article the window leaves out) is scattered into a (B, C) table in the same pass;
  the sums themselves are computed as without it.

Letters: B windows in a batch, L input tokens, P scored positions, K paths, T horizon, D LM width,
N sentences, V vocabulary.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Optional

import numpy as np
import torch

from planlm.args import LMRuntime, Runtime
from planlm.console import open_bar
from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.device import autocast
from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import CONFIDENCE, bootstrap_perplexity, write_per_article
from planlm.evaluate.loading import evaluation_inputs, load_checked
from planlm.evaluate.metrics import PathCounts, PerplexityMetrics, PlanUsage
from planlm.evaluate.positions import (NUM_CELLS, PER_ARTICLE_POSITIONS, cell_token_counts, target_cells,
                                       write_positions)
from planlm.jsonio import write_json
from planlm.models.planned_lm import add_evaluation
from planlm.plans.config import PlanConfig, evaluation_plans
from planlm.plans.policy import paths_summary
from planlm.plans.registry import plan_source
from planlm.speed import keep_freed_memory, speed_up_lm
from planlm.stage import StageDir, config_fingerprint, read_manifest

UNSCORED_NOTE = "the first token of every article is not scored (it has no context)"


def protocol_label(stride: int, context_length: int = 128) -> str:
    if stride == 1:
        return f"reference stride-1, {context_length - 1}-token context"
    if stride >= context_length:
        return f"non-overlapping {context_length}-token windows (the first token of each window is not scored)"
    return f"strided {stride}: {context_length}-token windows scoring their last {stride} tokens"


def scoring_windows(token_offsets: np.ndarray, articles: range | np.ndarray, context_length: int = 128,
                    stride: int = 1) -> np.ndarray:
    """(W, 4) int64 rows (article, start, first, end) of split-global token indices.

    The LM reads [start, end - 1) and scores the targets [first, end); every window stays inside its
    article. Articles with fewer than 2 tokens give none."""
    rows = []
    for article in articles:
        a0, a1 = int(token_offsets[article]), int(token_offsets[article + 1])
        if a1 - a0 < 2:
            continue
        end = min(a0 + context_length, a1)
        rows.append((article, a0, a0 + 1, end))
        while end < a1:
            new_end = min(end + stride, a1)
            start = max(a0, new_end - context_length)
            rows.append((article, start, max(end, start + 1), new_end))
            end = new_end
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def window_batches(windows: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Row indices of ``windows`` grouped by (input length, scored positions), batch_size at most."""
    lengths = windows[:, 3] - 1 - windows[:, 1]  # (W,) tokens the LM reads
    scored = windows[:, 3] - windows[:, 2]  # (W,) positions whose logits are needed
    order = np.lexsort((np.arange(len(windows)), scored, lengths))  # stable: windows stay in article order
    batches = []
    for key in np.unique(np.stack([lengths[order], scored[order]], 1), axis=0):
        members = order[(lengths[order] == key[0]) & (scored[order] == key[1])]
        batches.extend(members[i:i + batch_size] for i in range(0, len(members), batch_size))
    return batches


@torch.no_grad()
def score_windows(model, split: PreparedSplit, windows: np.ndarray, plan_table: torch.Tensor | None = None,
                  batch_size: int = 32, device: str | torch.device = "cpu", precision: str = "auto",
                  description: str = "scoring", cells: Optional[np.ndarray] = None):
    """Summed NLL of the scored targets of every window -> (W,) float64, on the stage's bar as ``description``.

    ``model`` is a PlannedLM (or any callable with its forward signature); ``plan_table`` (N_sent, D)
    holds the plan vector of every sentence (None: no conditioning). With ``cells`` (N_tok,) (the cell of each
    token as a target, ``planlm.evaluate.positions.target_cells``), also the NLL of every window per cell:
    returns ((W,), (W, C)); the (W,) sums are the same numbers as without."""
    device = torch.device(device)
    # Token arrays on the device once: every batch is a gather there (no host work, no sync per batch).
    input_ids_all = torch.from_numpy(np.array(split.input_ids)).to(device)  # (N_tok,)
    plan_sentence_all = torch.from_numpy(np.array(split.token_plan_sentence)).to(device)  # (N_tok,)
    cells_all = None if cells is None else torch.from_numpy(np.asarray(cells, dtype=np.int64)).to(device)  # (N_tok,)
    if plan_table is not None:
        plan_table = plan_table.to(device)
    batches = window_batches(windows, batch_size)
    # Each batch's sums go straight into arrays made once: small results kept batch after batch between the
    # batches' large transient buffers would fragment the heap, and it would grow with the split.
    sums = torch.zeros(len(windows), dtype=torch.float64, device=device)  # (W,)
    cell_sums = None if cells_all is None else torch.zeros(len(windows), NUM_CELLS, dtype=torch.float64,
                                                           device=device)  # (W, C)
    bar = open_bar(description, len(windows), "windows")
    for rows in batches:
        start, first, end = windows[rows[0], 1], windows[rows[0], 2], windows[rows[0], 3]
        length, num_scored = int(end - 1 - start), int(end - first)
        starts = torch.from_numpy(windows[rows, 1]).to(device)
        positions = starts[:, None] + torch.arange(length + 1, device=device)  # (B, L+1) tokens incl. targets
        tokens = input_ids_all[positions]  # (B, L+1)
        input_ids, targets = tokens[:, :-1], tokens[:, -num_scored:]  # (B, L), (B, P)
        kwargs = {}
        if plan_table is not None:
            kwargs["plan_embeds"] = plan_table[plan_sentence_all[positions[:, :-1]]]  # (B, L, D)
        with autocast(device, precision):
            token_nll = model.token_nll(input_ids, targets, **kwargs)  # (B, P)
        token_nll = token_nll.double()  # (B, P)
        index = torch.from_numpy(rows).to(device, non_blocking=True)  # (B,)
        sums.index_copy_(0, index, token_nll.sum(1))
        if cell_sums is not None:  # (B, C) each window's NLL per cell, beside (never into) its sum
            cell_sums.index_copy_(0, index, token_nll.new_zeros(len(rows), NUM_CELLS).scatter_add_(
                1, cells_all[positions[:, -num_scored:]], token_nll))
        bar.advance(len(rows))
    bar.close()
    nll = sums.cpu().numpy()
    return nll if cells is None else (nll, cell_sums.cpu().numpy())


@torch.no_grad()
def plan_vector_table(model, source, sentences: np.ndarray, num_sentences: int, chunk_size: int = 256,
                      device: str | torch.device = "cpu", precision: str = "auto") -> torch.Tensor:
    """(num_sentences, D) plan vector of each of ``sentences`` (other rows zero): one adapter call per
    sentence, in chunks, whatever K is."""
    device = torch.device(device)
    table = torch.zeros(num_sentences, model.hidden_size, device=device)
    for i in range(0, len(sentences), chunk_size):
        chunk = np.asarray(sentences[i:i + chunk_size], dtype=np.int64)
        plans = source(chunk).to(device)  # (N, K, T[, M]) each
        with autocast(device, precision):
            vectors = model.plan_vectors(*plans)  # (N, D)
        table[torch.from_numpy(chunk).to(device)] = vectors.float()
    return table


def evaluate_split(model, prepared: PreparedDataset, split: PreparedSplit, plans: PlanConfig,
                   num_articles: int, stride: int = 1, context_length: int = 128, batch_size: int = 32,
                   device: str | torch.device = "cpu", precision: str = "auto", plan_usage: bool = False) -> dict:
    """In-memory evaluation of the first ``num_articles`` articles -> per-article arrays and timings
    (with ``plan_usage``, also ``nll_sums_shuffled``: the same windows with the plans shuffled across
    the evaluated sentences, untimed), ``num_paths`` (N_sent evaluated,): the paths sampled per boundary, and
    ``cell_nll_sums`` / ``cell_tokens`` (N_art, C): each article's NLL and scored tokens per cell of
    ``planlm.evaluate.positions`` (position in the sentence x context fallen out of the window)."""
    device = torch.device(device)
    model = model.to(device).eval()
    began = time.perf_counter()
    num_sentences = int(split.sentence_offsets[num_articles])
    sentences = np.arange(num_sentences)
    plan_table, path_counts = None, None
    planner_done = began
    if plans.has_plans:
        source = plan_source(plans, prepared, split, sentences=sentences, device=device, precision=precision)
        planner_done = time.perf_counter()
        path_counts = getattr(source, "path_counts", None)
        plan_table = plan_vector_table(model, source, sentences, split.num_sentences, device=device,
                                       precision=precision)
    plans_done = time.perf_counter()
    windows = scoring_windows(split.token_offsets, range(num_articles), context_length, stride)
    cells = target_cells(split.token_sentence, split.token_offsets, windows, context_length)  # (N_tok,)
    window_nll, window_cell_nll = score_windows(model, split, windows, plan_table, batch_size, device, precision,
                                                f"scoring {split.path.name}", cells=cells)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    finished = time.perf_counter()
    def per_article(values: np.ndarray) -> np.ndarray:
        return np.bincount(windows[:, 0], weights=values, minlength=num_articles)[:num_articles]

    tokens = per_article(windows[:, 3] - windows[:, 2]).astype(np.int64)
    result = {"nll_sums": per_article(window_nll), "tokens": tokens, "windows": len(windows),
              "cell_nll_sums": np.stack([per_article(window_cell_nll[:, c]) for c in range(NUM_CELLS)], 1),
              "cell_tokens": cell_token_counts(cells, split.token_offsets, num_articles),
              "wall_time_s": finished - began, "plan_time_s": plans_done - began, "lm_time_s": finished - plans_done,
              "planner_time_s": planner_done - began, "adapter_time_s": plans_done - planner_done,
              "num_paths": plans.sampled_paths(path_counts, sentences)}
    if plan_usage:
        from planlm.evaluate.plan_usage import check_has_plans, plan_permutation
        from planlm.plans.sources import ShuffledPlans

        check_has_plans(plans, "evaluate")
        shuffled = ShuffledPlans(source, plan_permutation(num_sentences))
        shuffled_table = plan_vector_table(model, shuffled, sentences, split.num_sentences, device=device,
                                           precision=precision)
        result["nll_sums_shuffled"] = per_article(score_windows(model, split, windows, shuffled_table, batch_size,
                                                                device, precision, "scoring, plans shuffled"))
    return result


def evaluate(model_dir: str, prepared_dir: str, out_dir: str, split: str = "test", plans: PlanConfig = PlanConfig(),
             stride: int = 1, context_length: int = 128, max_articles: Optional[int] = None, batch_size: int = 32,
             bootstrap_samples: int = 1000, plan_usage: Optional[bool] = None,
             runtime: Runtime = Runtime()) -> PerplexityMetrics:
    """Perplexity of a trained (planned) LM on a prepared split, with a bootstrap CI over articles.

    Writes ``metrics.json`` (ppl, ci_low, ci_high, nll, tokens, articles, protocol, wall_time_s,
    tokens_per_s, conditioning, K, T, tau; the compute: paths sampled per boundary (paths_mean, paths_hist),
    planner_time_s, adapter_time_s, lm_time_s), ``per_article.csv`` (article, id, source, nll_sum, tokens),
    ``per_article_positions.csv`` (the same NLL and tokens per position in the sentence and context fallen out of
    the window: ``planlm.evaluate.positions``), ``num_paths.npy`` (paths of each evaluated boundary) and, last,
    ``manifest.json``; a complete folder for
    the same settings and weights is reused.

    Args:
        model_dir: Folder of a finished ``planlm train-lm`` (or a plain HF causal-LM folder: plans kind none).
        prepared_dir: Prepared corpus (same tokenizer and codebook as the model's).
        out_dir: Evaluation folder to write.
        split: Split to evaluate.
        plans: The plans to evaluate with (kind, num_paths K, horizon T, temperature tau, planner_dir, expectation,
            seed, plans_dir, path_policy); every field left unset is the model's own (planlm.plans.config).
            A plans_dir reads a plan cache instead of running the planner, with the path policy it was sampled under.
        stride: 1 = the reference protocol (every token with up to context_length - 1 tokens of context);
            S scores the last S tokens of each context_length window; context_length = non-overlapping.
        context_length: Window length in tokens (context + scored token).
        max_articles: Evaluate only the first N articles of the split.
        batch_size: Windows per LM forward pass.
        bootstrap_samples: Bootstrap resamples of the 95% confidence interval.
        plan_usage: Also score the split with the plans shuffled across its sentences (a fixed seeded
            permutation): how much the LM reads its plans (plan_usage_* in metrics.json). None: whenever
            the model reads plans; true with plans kind none is an error.
        runtime: The device and precision of the LM, the adapter and the planner's sampling (part of the key).

    Returns:
        The metrics (``PerplexityMetrics``; ``<out_dir>/metrics.json`` holds its ``to_dict()``).
    """
    _check_protocol(stride, context_length, batch_size, max_articles)
    prepared, split_view, model = load_checked(model_dir, prepared_dir, split)
    plans = evaluation_plans(plans, model, model_dir)
    plans.check_source()
    if plan_usage:
        from planlm.evaluate.plan_usage import check_has_plans

        check_has_plans(plans, f"evaluate {model_dir}")
    plan_usage = plans.has_plans if plan_usage is None else plan_usage
    torch_device, precision = runtime.torch_device(), runtime.resolved_precision()
    num_articles = split_view.num_articles if max_articles is None else min(max_articles, split_view.num_articles)
    plans_manifest = read_manifest(plans.plans_dir) if plans.plans_dir else None
    key = {**evaluation_inputs(model_dir, prepared_dir, plans.planner_dir), "split": split,
           "plan_spec": plans.cache_key(), "stride": stride, "context_length": context_length, "articles": num_articles,
           "device_type": torch_device.type, "precision": precision, "bootstrap_samples": bootstrap_samples,
           "confidence": CONFIDENCE, "plan_usage": plan_usage, "plans": config_fingerprint(plans.plans_dir)}
    with StageDir(out_dir, key) as stage:
        if stage.reused:
            metrics = PerplexityMetrics.load(stage.path)
            add_evaluation(model_dir, metrics.to_dict())  # a card written before this evaluation gets it too
            return metrics
        keep_freed_memory()
        speed_up_lm(model, LMRuntime(), "evaluate")  # the chunked NLL
        result = evaluate_split(model, prepared, split_view, plans, num_articles, stride, context_length, batch_size,
                                torch_device, precision, plan_usage)
        metrics = _metrics(result, plans, split_view, num_articles, plans_manifest, stride=stride,
                           context_length=context_length, bootstrap_samples=bootstrap_samples, confidence=CONFIDENCE,
                           plan_usage=plan_usage, model_dir=model_dir, prepared_dir=prepared_dir, split=split,
                           device=torch_device, precision=precision)
        _write_evaluation(stage, metrics, result, split_view, num_articles)
    add_evaluation(model_dir, metrics.to_dict())
    _print_summary(metrics, plans)
    return metrics


def _check_protocol(stride: int, context_length: int, batch_size: int, max_articles: Optional[int]) -> None:
    if not 1 <= stride <= context_length:
        raise PlanlmError(f"--stride {stride} must be in [1, --context_length={context_length}]")
    if context_length < 2:
        raise PlanlmError(f"--context_length {context_length} must be >= 2")
    if batch_size < 1:
        raise PlanlmError(f"--batch_size {batch_size} must be >= 1")
    if max_articles is not None and max_articles < 1:
        raise PlanlmError(f"--max_articles {max_articles} must be >= 1")


def _metrics(result: dict, plans: PlanConfig, split_view: PreparedSplit, num_articles: int,
             plans_manifest: Optional[dict], *, stride: int, context_length: int, bootstrap_samples: int,
             confidence: float, plan_usage: bool, model_dir: str, prepared_dir: str, split: str,
             device: torch.device, precision: str) -> PerplexityMetrics:
    """Perplexity with its bootstrap CI (over source documents), the compute, the settings."""
    sources = _sources(split_view, num_articles)
    interval = bootstrap_perplexity(result["nll_sums"], result["tokens"], bootstrap_samples, confidence,
                                    clusters=sources)
    total_tokens = int(result["tokens"].sum())
    usage = None
    if plan_usage:
        from planlm.evaluate.plan_usage import plan_usage_metrics

        usage = plan_usage_metrics(result["nll_sums"], result["nll_sums_shuffled"], result["tokens"],
                                   bootstrap_samples, confidence, clusters=sources)
    return PerplexityMetrics(
        ppl=interval["ppl"], ci_low=interval["ci_low"], ci_high=interval["ci_high"], confidence=confidence,
        nll=float(result["nll_sums"].sum() / total_tokens), tokens=total_tokens, articles=num_articles,
        unscored_tokens=int(split_view.token_offsets[num_articles]) - total_tokens,
        protocol=protocol_label(stride, context_length), note=UNSCORED_NOTE, stride=stride,
        context_length=context_length, windows=result["windows"], wall_time_s=result["wall_time_s"],
        plan_time_s=result["plan_time_s"], lm_time_s=result["lm_time_s"], planner_time_s=result["planner_time_s"],
        adapter_time_s=result["adapter_time_s"], plans_from_cache=bool(plans.plans_dir),
        path_policy=asdict(plans.path_policy),
        cache_planner_time_s=(plans_manifest.get("planner_time_s") or {}).get(split) if plans.plans_dir else None,
        paths=PathCounts(**paths_summary(result["num_paths"],
                                         plans.num_paths if plans.plan_kind.samples_paths else None)),
        tokens_per_s=total_tokens / max(result["wall_time_s"], 1e-9), conditioning=str(plans.kind),
        K=plans.num_paths, T=plans.horizon, tau=plans.temperature, expectation=bool(plans.expectation),
        top_actions=plans.top_actions if plans.expectation else None, seed=plans.seed,
        fixed_action=plans.fixed_action if plans.plan_kind.constant else None, planner_dir=plans.planner_dir,
        plans_dir=plans.plans_dir, model_dir=str(model_dir), prepared_dir=str(prepared_dir), split=split,
        device=str(device), precision=precision, plan_usage=usage)


def _sources(split_view: PreparedSplit, num_articles: int) -> list[str]:
    """The source document of each evaluated article (a piece's document; an uncut article's own id)."""
    return [str(a.get("source", a["id"])) for a in split_view.articles[:num_articles]]


def _write_evaluation(stage: StageDir, metrics: PerplexityMetrics, result: dict, split_view: PreparedSplit,
                      num_articles: int) -> None:
    """per_article.csv, per_article_positions.csv, num_paths.npy, metrics.json and, last, the manifest."""
    articles, sources = split_view.articles, _sources(split_view, num_articles)
    write_per_article(stage.path / "per_article.csv", [
        {"article": a, "id": articles[a]["id"], "source": sources[a], "nll_sum": repr(float(result["nll_sums"][a])),
         "tokens": int(result["tokens"][a])} for a in range(num_articles)])
    if "cell_nll_sums" in result:
        write_positions(stage.path / PER_ARTICLE_POSITIONS, [articles[a]["id"] for a in range(num_articles)],
                        result["cell_nll_sums"], result["cell_tokens"])
    np.save(stage.path / "num_paths.npy", result["num_paths"])
    write_json(stage.path / "metrics.json", metrics.to_dict())
    stage.finish(metrics=metrics.to_dict())


def _print_summary(metrics: PerplexityMetrics, plans: PlanConfig) -> None:
    m = metrics
    print(f"{m.model_dir} on {m.split} ({m.articles} articles, {m.tokens} tokens, {m.protocol}; "
          f"plans {plans.label()}): "
          f"ppl {m.ppl:.3f} [{m.ci_low:.3f}, {m.ci_high:.3f}] in {m.wall_time_s:.1f}s ({m.tokens_per_s:.0f} tokens/s; "
          f"{m.paths.paths_mean:.2f} paths per boundary, planner {m.planner_time_s:.1f}s, "
          f"LM {m.lm_time_s:.1f}s){plan_usage_text(m.plan_usage) if m.plan_usage else ''}")


def plan_usage_text(usage: PlanUsage) -> str:
    """'; plans shuffled: ppl 46.120, +0.910 [+0.310, +1.520] (+0.0197 nats/token)': one line per evaluation."""
    return (f"; plans shuffled: ppl {usage.ppl_shuffled_plans:.3f}, {usage.plan_usage_ppl:+.3f} "
            f"[{usage.plan_usage_ci_low:+.3f}, {usage.plan_usage_ci_high:+.3f}] "
            f"({usage.plan_usage_nats:+.4f} nats/token)")
