"""``planlm adherence``: how often a planned LM writes the sentence its plan asks for.

Outlines come from the true action sequences of a split's articles: at a sentence start b of an article (at most
``outlines_per_article`` drawn, each with ``outline_length`` true sentences after it), the prefix before b is the
prompt and the actions of sentences b .. b+L-1 are the requested ones. Each condition writes L sentences from
the same prompts:

- ``outline``: the plans are the outline (``planlm.evaluate.outline``), and generation stops after its L sentences;
- ``own``: the model's own plans (its planner; ``--plans`` overrides them, e.g. a planner for an oracle model);
- ``fixed``: the model's plans replaced by the Fixed baseline's constant action;
- ``shuffled``: the outline of a boundary in another source document (a control: an LM that ignored its plans
  would score the same). It is scored twice: against the true outline (the control) and, as ``shuffled_asked``,
  against the outline it was given. The latter is steering alone: the prefix does not predict another document's
  actions, so an LM that writes them reads its plans, where hits on the true outline also count what the LM
  guesses from the prefix. The other outline never comes from the same document, whose outlines could overlap
  the true one or share its topic.

Every generated sentence that is complete is embedded with the corpus's encoder and assigned its nearest codebook
entry (as ``planlm prepare`` assigned the training sentences): **adherence** is the fraction whose action is the
requested one, **top-5** the fraction whose 5 nearest entries hold it. **Chance** is matched to the action
frequencies: the agreement of requested and realised actions paired at random (sum_a p_req(a) p_real(a), the
expected agreement of Cohen's kappa; top-5 likewise), from the same condition's sentences. Since only complete
sentences are scored, a condition that finishes fewer of them is not penalised there: **of asked** is the hits
over every sentence asked for, an unfinished sentence a miss, reported beside it.

Intervals resample source documents (``planlm.evaluate.bootstrap``: a document's pieces go together) and, with
several seeds (``--model_dir`` holding ``seed<N>/`` model folders), add the spread over seeds with a t quantile
(``seeded_interval``).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Optional

import numpy as np

from planlm.args import Runtime
from planlm.console import open_bar
from planlm.data.actions import ranked_actions
from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import CONFIDENCE, seed_folders, seeded_interval
from planlm.evaluate.generate import build_generator, encoder_embed_fn
from planlm.evaluate.generator import GENERATION_VERSION, EmbedFn, SamplingConfig
from planlm.evaluate.loading import model_fingerprint
from planlm.evaluate.metrics import AdherenceMetrics, ConditionAdherence, SeededInterval
from planlm.evaluate.outline import Outline
from planlm.jsonio import write_json
from planlm.plans.config import PlanSettings
from planlm.stage import StageDir, config_fingerprint, read_manifest

Condition = Literal["outline", "own", "fixed", "shuffled"]
TOP = 5
ADHERENCE_TEMPERATURE = 1.0
"""The LM's sampling temperature in every condition: the protocol draws from the whole vocabulary as trained."""
FIELDS = ("seed", "condition", "article", "id", "source", "boundary", "position", "requested", "asked", "realised",
          f"top{TOP}", "ranked", "text")
ASKED = "shuffled_asked"
"""The shuffled condition scored against the outline it was given (``summarise``)."""
LABELS = {ASKED: "shuffled, scored on the outline it was given"}


@dataclass
class OutlineTask:
    """One outline: the prefix of ``article`` before its sentence ``boundary`` and the L true actions after it."""

    article: int
    boundary: int
    actions: list[int]


def adherence(model_dir: str, prepared_dir: str, out_dir: str, split: str = "test", max_articles: Optional[int] = 20,
              outlines_per_article: int = 2, outline_length: int = 3,
              conditions: list[Condition] = ["outline", "own", "fixed"], plans: PlanSettings = PlanSettings(),
              seed: int = 0, context_length: int = 128,
              tokens_per_sentence: int = 64, plan_guidance: float = 1.0,
              bootstrap_samples: int = 1000,
              runtime: Runtime = Runtime()) -> AdherenceMetrics:
    """How often a planned LM writes the action its plan asks for, against chance, its own plans and Fixed.

    Writes ``per_sentence.csv`` (every generated sentence: requested and realised action, top-5 hit, text),
    ``metrics.json`` (per condition: adherence, top-5, frequency-matched chance and adherence / chance, each with
    an interval over source documents and seeds), ``adherence.md`` (the table) and, last, ``manifest.json``; a
    complete folder is reused.

    Args:
        model_dir: A ``planlm train-lm`` folder, or a folder of ``seed<N>/`` ones (intervals over seeds too).
        prepared_dir: Prepared corpus (encoder, splitter, codebook, the articles).
        out_dir: Output folder.
        split: Split whose articles give the prompts and the outlines.
        max_articles: Use the first N articles (None: all).
        outlines_per_article: Outlines (sentence starts) drawn per article.
        outline_length: L, the sentences of each outline (and of every condition's continuation).
        conditions: Of outline, own, fixed, shuffled (shuffled is also reported as shuffled_asked: scored on the
            outline it was given).
        plans: The own condition's plans; unset fields: the model's own (an oracle model's own plans would be the
            outline itself: --plans.kind planner_sampled --plans.planner_dir DIR). Its planner_dir also serves the
            other conditions (where the model's planner moved).
        seed: Seed of the outlines drawn, the shuffle, generation and the bootstrap.
        context_length: Prefix tokens at most.
        tokens_per_sentence: Tokens generated at most per outlined sentence (L times this in all).
        plan_guidance: Plan guidance w of every condition (``SamplingConfig.plan_guidance``; 1: off, > 1: each
            condition's plans, outline, own, Fixed or shuffled, steer more strongly).
        bootstrap_samples: Bootstrap resamples of the 95% intervals.
        runtime: The device and precision of the LM, the adapter and the planner (runtime.device,
            runtime.precision).

    Returns:
        The metrics (``AdherenceMetrics``: per condition adherence, top5, chance, chance_top5, over_chance, ...;
        ``<out_dir>/metrics.json`` holds its ``to_dict()``).
    """
    _check_args(outline_length, outlines_per_article, max_articles, tokens_per_sentence, conditions)
    sampling = SamplingConfig(max_new_tokens=outline_length * tokens_per_sentence, temperature=ADHERENCE_TEMPERATURE,
                              plan_guidance=plan_guidance)
    models = model_seeds(model_dir)
    prepared = PreparedDataset(prepared_dir)
    split_view = prepared.split(split)
    tasks = select_outlines(split_view, max_articles, outlines_per_article, outline_length, seed)
    by_condition = condition_plans(plans)
    key = {"models": {s: model_fingerprint(folder) for s, folder in models.items()},
           "prepared": config_fingerprint(prepared_dir), "split": split, "tasks": tasks,
           "conditions": list(conditions), "specs": {c: _settings_key(by_condition[c]) for c in conditions},
           "seed": seed,
           "context_length": context_length, "sampling": sampling.reuse_key(), "bootstrap_samples": bootstrap_samples,
           "confidence": CONFIDENCE, "generation_version": GENERATION_VERSION,
           "scoring": "of_asked, shuffled from another document"}  # folders scored otherwise are rebuilt
    with StageDir(out_dir, key) as stage:
        if stage.reused:
            return AdherenceMetrics.load(stage.path)
        embed_fn = encoder_embed_fn(prepared)
        run = _Run(prepared_dir, split, split_view, tasks, sampling, context_length, seed, runtime,
                   embed_fn, prepared.codebook.numpy())
        bar = open_bar("writing to outlines", len(models) * len(conditions) * len(tasks), "outlines")
        rows = [row for model_seed, folder in models.items() for condition in conditions
                for row in run.measure(folder, model_seed, condition, by_condition[condition], bar)]
        bar.close()
        metrics = summarise(rows, tasks, split_view, list(models), list(conditions), prepared.num_actions,
                            bootstrap_samples, CONFIDENCE, seed)
        _write_outputs(stage, rows, metrics)
    guidance = f", plan guidance {plan_guidance:g}" if sampling.guided else ""
    print(f"{model_dir} on {split} ({len(tasks)} outlines of {outline_length} sentences, seeds {list(models)}"
          f"{guidance}):")
    print(table(metrics))
    return metrics


def _check_args(outline_length: int, outlines_per_article: int, max_articles: Optional[int], tokens_per_sentence: int,
                conditions: list) -> None:
    for name, value in (("outline_length", outline_length), ("outlines_per_article", outlines_per_article),
                        ("tokens_per_sentence", tokens_per_sentence),
                        ("max_articles", 1 if max_articles is None else max_articles)):
        if value < 1:
            raise PlanlmError(f"--{name} {value} must be >= 1")
    unknown = [c for c in conditions if c not in Condition.__args__]
    if unknown or not conditions:
        raise PlanlmError(f"--conditions {conditions}: choose among {', '.join(Condition.__args__)}")


def model_seeds(model_dir: str) -> dict[int, Path]:
    """{seed: model folder}: ``model_dir`` itself (seed from a ``seed<N>`` name, else 0), or its ``seed<N>/``."""
    folder = Path(model_dir)
    if (folder / "planned_lm.json").is_file():
        return {int(folder.name[4:]) if folder.name[4:].isdigit() and folder.name.startswith("seed") else 0: folder}
    seeds = seed_folders(folder, marker="planned_lm.json")
    if not seeds:
        raise PlanlmError(f"{model_dir}: no planned LM here (planned_lm.json) nor in seed<N>/ folders; give a "
                          f"`planlm train-lm` folder")
    return seeds


def condition_plans(plans: PlanSettings) -> dict[str, PlanSettings]:
    """The plan overrides of each condition: ``plans`` for own, its planner folder for the others, and the Fixed
    baseline's kind for fixed."""
    planner = PlanSettings(planner_dir=plans.planner_dir)
    return {"outline": planner, "shuffled": planner, "own": plans,
            "fixed": PlanSettings(kind="fixed", planner_dir=plans.planner_dir)}


def _settings_key(plans: PlanSettings) -> dict:
    return {f.name: str(getattr(plans, f.name)) for f in fields(plans) if getattr(plans, f.name) is not None}


def select_outlines(split: PreparedSplit, max_articles: Optional[int], per_article: int, length: int,
                    seed: int) -> list[OutlineTask]:
    """Up to ``per_article`` sentence starts b >= 1 of each of the first ``max_articles`` articles with ``length``
    true sentences from b, drawn with ``seed``, each with those sentences' actions."""
    rng = np.random.default_rng(seed)
    offsets, actions = np.asarray(split.sentence_offsets), np.asarray(split.actions)
    tasks = []
    for article in range(split.num_articles if max_articles is None else min(max_articles, split.num_articles)):
        starts = np.arange(1, int(offsets[article + 1] - offsets[article]) - length + 1)
        if len(starts) > per_article:
            starts = np.sort(rng.choice(starts, size=per_article, replace=False))
        tasks += [OutlineTask(article, int(b), [int(a) for a in actions[offsets[article] + b:
                                                                          offsets[article] + b + length]])
                  for b in starts]
    if not tasks:
        raise PlanlmError(f"{split.path}: no article of the first {max_articles} has {length + 1} sentences; lower "
                          f"--outline_length or raise --max_articles")
    return tasks


@dataclass
class _Run:
    """What every (seed, condition) of one measurement shares."""

    prepared_dir: str
    split: str
    split_view: PreparedSplit
    tasks: list[OutlineTask]
    sampling: SamplingConfig
    context_length: int
    seed: int
    runtime: Runtime
    embed_fn: EmbedFn
    codebook: np.ndarray

    def measure(self, model_dir: Path, model_seed: int, condition: str, plans: PlanSettings, bar) -> list[dict]:
        """Every task's continuation under ``condition``, one row per complete sentence of the L asked for."""
        generator, _, _ = build_generator(str(model_dir), self.prepared_dir, self.split, plans, self.runtime, self.seed,
                                          embed_fn=self.embed_fn)
        outlines = (shuffled_outlines(self.tasks, self.seed, task_sources(self.tasks, self.split_view))
                    if condition == "shuffled" else [t.actions for t in self.tasks])
        rows = []
        for task, plan in zip(self.tasks, outlines):
            prompt = generator.prompt_from_article(self.split_view, task.article, task.boundary, self.context_length)
            outline = Outline(plan, then="stop") if condition in ("outline", "shuffled") else None
            result = generator.generate(prompt, self.sampling, outline=outline, max_sentences=len(task.actions))
            article = self.split_view.articles[task.article]
            rows += [{"seed": model_seed, "condition": condition, "article": task.article, "id": article["id"],
                      "source": article.get("source", article["id"]), "boundary": task.boundary, "position": j,
                      "requested": task.actions[j], "asked": plan[j] if outline is not None else None,
                      "text": s["text"].strip()}
                     for j, s in enumerate(result.sentences[:len(task.actions)]) if s["complete"]]
            bar.advance()
        return self._realised(rows)

    def _realised(self, rows: list[dict]) -> list[dict]:
        if rows:
            ranked = ranked_actions(self.embed_fn([r["text"] for r in rows]), self.codebook, TOP)  # (N, TOP)
            for row, top in zip(rows, ranked):
                row["realised"], row[f"top{TOP}"], row["ranked"] = int(top[0]), int(row["requested"] in top), top
        return rows


def task_sources(tasks: list[OutlineTask], split: PreparedSplit) -> list[str]:
    """The source document of each task's article."""
    return [str(split.articles[t.article].get("source", split.articles[t.article]["id"])) for t in tasks]


def shuffled_outlines(tasks: list[OutlineTask], seed: int, sources: list[str]) -> list[list[int]]:
    """Each task's outline replaced by that of a task from another source document (``sources``, one per task):
    the tasks in a seeded random order, each taking the next one's outline whose document differs, cut to its
    length."""
    if len(set(sources)) < 2:
        raise PlanlmError(f"the shuffled condition needs outlines from at least two source documents, but all "
                          f"{len(tasks)} come from {sources[0]!r}; raise --max_articles or leave shuffled out")
    order = np.random.default_rng(seed + 1).permutation(len(tasks))
    out: list[list[int]] = [[] for _ in tasks]
    for k, task in enumerate(order):
        step = 1
        while sources[order[(k + step) % len(tasks)]] == sources[task]:
            step += 1
        out[task] = list(tasks[order[(k + step) % len(tasks)]].actions[:len(tasks[task].actions)])
    return out


def summarise(rows: list[dict], tasks: list[OutlineTask], split: PreparedSplit, seeds: list[int],
              conditions: list[str], num_actions: int, num_samples: int, confidence: float,
              seed: int) -> AdherenceMetrics:
    """Per condition: adherence, top-5, chance, chance top-5 and adherence / chance, over documents and seeds; and
    paired (the same prompts, documents resampled together, seed by seed) outline's adherence minus each other's."""
    if "shuffled" in conditions:  # also scored against the outline it was given: steering alone
        rows, conditions = with_asked(rows), [*conditions, ASKED]
    articles, clusters = _documents(tasks, split)
    asked = len(tasks) * len(tasks[0].actions)

    def interval(statistic) -> SeededInterval:
        return SeededInterval.from_dict(seeded_interval(statistic, len(seeds), len(articles), num_samples,
                                                        confidence, seed, clusters))

    tables = {c: _seed_tables(rows, c, seeds, articles, num_actions, tasks) for c in conditions}
    outline = _statistics(tables["outline"])["adherence"] if "outline" in conditions else None
    measured = {}
    for condition in conditions:
        stats = _statistics(tables[condition])
        other = stats["adherence"]
        measured[condition] = ConditionAdherence(
            **{name: interval(fn) for name, fn in stats.items()},
            sentences=[int(t["counts"].sum()) for t in tables[condition]], sentences_asked=asked,
            outline_minus=(interval(lambda w, s: outline(w, s) - other(w, s))
                           if outline is not None and condition != "outline" else None))
    return AdherenceMetrics(measured)


def with_asked(rows: list[dict]) -> list[dict]:
    """``rows`` and, for each shuffled one, a copy under ``ASKED`` scored against the outline it was given (not for
    rows of folders written before the ``asked`` column)."""
    return rows + [{**r, "condition": ASKED, "requested": r["asked"], f"top{TOP}": int(r["asked"] in r["ranked"])}
                   for r in rows if r["condition"] == "shuffled" and r.get("asked") is not None]


def read_rows(folder: str | Path) -> list[dict]:
    """The rows of a finished folder's ``per_sentence.csv`` as ``summarise`` takes them."""
    rows = []
    with open(Path(folder) / "per_sentence.csv", newline="") as f:
        for r in csv.DictReader(f):
            row = {**r, **{k: int(r[k]) for k in ("seed", "article", "boundary", "position", "requested", "realised",
                                                   f"top{TOP}")}}
            row["asked"] = int(r["asked"]) if r.get("asked") else None  # folders before the column: None
            row["ranked"] = np.asarray([int(a) for a in r["ranked"].split()])
            rows.append(row)
    return rows


def paired_difference(folder_a: str | Path, folder_b: str | Path, prepared_dir: str, num_samples: int = 2000,
                      confidence: float = 0.95, seed: int = 0) -> dict[str, dict[str, dict]]:
    """Two finished folders of the same outlines and seeds (e.g. two plan guidance weights), paired: per condition
    of both (shuffled_asked too), {adherence, of_asked, over_chance: a - b as ``seeded_interval`` gives it}, the
    documents resampled together for both and the spread over seeds added."""
    configs = [read_manifest(folder)["config"] for folder in (folder_a, folder_b)]
    if configs[0]["tasks"] != configs[1]["tasks"] or list(configs[0]["models"]) != list(configs[1]["models"]):
        raise PlanlmError(f"{folder_a} and {folder_b}: not the same outlines and seeds, so they cannot be paired")
    prepared = PreparedDataset(prepared_dir)
    tasks = [OutlineTask(**t) for t in configs[0]["tasks"]]
    articles, clusters = _documents(tasks, prepared.split(configs[0]["split"]))
    seeds = [int(s) for s in configs[0]["models"]]
    rows = [with_asked(read_rows(folder)) for folder in (folder_a, folder_b)]
    shared = [c for c in dict.fromkeys(r["condition"] for r in rows[0]) if any(r["condition"] == c for r in rows[1])]
    out = {}
    for condition in shared:
        stats = [_statistics(_seed_tables(side, condition, seeds, articles, prepared.num_actions, tasks))
                 for side in rows]
        out[condition] = {name: seeded_interval(lambda w, s, name=name: stats[0][name](w, s) - stats[1][name](w, s),
                                                len(seeds), len(articles), num_samples, confidence, seed, clusters)
                          for name in ("adherence", "of_asked", "over_chance")}
    return out


def _documents(tasks: list[OutlineTask], split: PreparedSplit) -> tuple[list[int], list]:
    """The articles of ``tasks`` (sorted) and the source document of each: what the bootstrap resamples together."""
    articles = sorted({t.article for t in tasks})
    return articles, [split.articles[a].get("source", split.articles[a]["id"]) for a in articles]


def _seed_tables(rows: list[dict], condition: str, seeds: list[int], articles: list[int], num_actions: int,
                 tasks: list[OutlineTask]) -> list:
    """``_article_tables`` of ``condition``'s rows, one per seed, each with ``asked``: the sentences asked of each
    article (its outlines' lengths)."""
    index = {a: i for i, a in enumerate(articles)}
    asked = np.zeros(len(articles))
    for task in tasks:
        asked[index[task.article]] += len(task.actions)
    return [{**_article_tables([r for r in rows if r["condition"] == condition and r["seed"] == s], articles,
                               num_actions), "asked": asked} for s in seeds]


def _article_tables(rows: list[dict], articles: list[int], num_actions: int) -> dict[str, np.ndarray]:
    """Per article (N_art,): sentences, hits, top-5 hits; and the chance matrices (N_art, N_art): how many pairs
    (requested of a sentence of article i, realised of a sentence of article j) agree, top-1 and top-5."""
    index = {a: i for i, a in enumerate(articles)}
    size = len(articles)
    counts, hits, hits_top = np.zeros(size), np.zeros(size), np.zeros(size)
    requested, realised, realised_top = (np.zeros((size, num_actions)) for _ in range(3))
    for row in rows:
        i = index[row["article"]]
        counts[i] += 1
        hits[i] += row["requested"] == row["realised"]
        hits_top[i] += row[f"top{TOP}"]
        requested[i, row["requested"]] += 1
        realised[i, row["realised"]] += 1
        realised_top[i, row["ranked"]] += 1  # the sentence's TOP nearest actions
    return {"counts": counts, "hits": hits, "hits_top": hits_top, "chance": requested @ realised.T,
            "chance_top": requested @ realised_top.T}


def _statistics(tables: list[dict]) -> dict:
    """statistic(weights (R, N_art), seed index) -> (R,) for each reported number."""
    def ratio(key):
        return lambda w, s: (w @ tables[s][key]) / (w @ tables[s]["counts"])

    def chance(key):
        return lambda w, s: ((w @ tables[s][key]) * w).sum(1) / (w @ tables[s]["counts"]) ** 2

    return {"adherence": ratio("hits"), "of_asked": lambda w, s: (w @ tables[s]["hits"]) / (w @ tables[s]["asked"]),
            "top5": ratio("hits_top"), "chance": chance("chance"),
            "chance_top5": chance("chance_top"),
            "over_chance": lambda w, s: ratio("hits")(w, s) / chance("chance")(w, s)}


def table(metrics: AdherenceMetrics) -> str:
    """A Markdown table of the metrics, one row per condition."""
    def cell(value: SeededInterval, percent: bool = True) -> str:
        scale, unit = (100, "%") if percent else (1, "x")
        return f"{value.mean * scale:.1f}{unit} [{value.ci_low * scale:.1f}, {value.ci_high * scale:.1f}]"

    lines = ["| condition | adherence [95% CI] | of asked (unfinished: a miss) | top-5 | chance | adherence / chance | "
             "outline - this (paired) | sentences (per seed) |", "|---|---|---|---|---|---|---|---|"]
    for condition, m in metrics.conditions.items():
        minus = cell(m.outline_minus) if m.outline_minus is not None else ""
        of_asked = cell(m.of_asked) if m.of_asked is not None else "n/a"
        lines.append(f"| {LABELS.get(condition, condition)} | {cell(m.adherence)} | {of_asked} | {cell(m.top5)} | "
                     f"{cell(m.chance)} | "
                     f"{cell(m.over_chance, False)} | {minus} | {' / '.join(map(str, m.sentences))} of "
                     f"{m.sentences_asked} |")
    return "\n".join(lines)


def _write_outputs(stage: StageDir, rows: list[dict], metrics: AdherenceMetrics) -> None:
    """per_sentence.csv, metrics.json, adherence.md and, last, the manifest."""
    with open(stage.path / "per_sentence.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({**row, "ranked": " ".join(map(str, row["ranked"]))} for row in rows)
    write_json(stage.path / "metrics.json", metrics.to_dict())
    (stage.path / "adherence.md").write_text(table(metrics) + "\n")
    stage.finish(metrics={c: m.means() for c, m in metrics.conditions.items()})


__all__ = ["adherence", "select_outlines", "shuffled_outlines", "task_sources", "summarise", "model_seeds", "table",
           "paired_difference", "read_rows", "with_asked", "AdherenceMetrics"]
