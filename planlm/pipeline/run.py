"""`planlm run`: the whole pipeline from one YAML file.

Stages and their folders under ``out_dir`` (named in ``planlm.pipeline.layout``; each folder is
self-describing, with a manifest written last, so a stage is reused when its inputs and settings are
unchanged and resumed when it was interrupted): prepare, train-planner (a shared planner, and optional
planners of conditions with a `planner` section of their own; conditions with equal sections share the
first one's), an optional plain LM pretrained once as the start of every condition, then train-lm,
evaluate and edit-distance (optional) per condition, the sweeps (optional) and the report.

With ``seeds: [0, 1, 2]`` the base LM and every condition are trained and evaluated once per seed,
each in ``seed<N>/`` under its folders; the prepared corpus and the planners are shared by all seeds, and
the sweeps use the first seed's models. With ``seed_draws: method`` each seed also draws its own codebook (k-means
seeded with it, ``planlm codebook``), trains its own planners (``planner.train.seed`` = the seed) and runs every
sweep on its own models. Within a seed the conditions are paired (same start weights, data
order and dropout: see train-lm).

While it runs, `planlm run` holds its run folder: a second `planlm run` on the same folder is refused
with the holder's pid (see ``planlm.stage.lock``).

A condition that fails is recorded (``results.json``, the report) and the others go on; at the end each stage
that did not finish is printed with its one-line cause, and `planlm run` exits with status 1 (``StagesFailed``;
2 is a bad config or input that stopped the run, 143 SIGTERM). A finished stage whose files fail the cheap check
of ``planlm.stage.integrity`` is rebuilt, with a note naming the file; the stages around it are reused. Each YAML
section is validated against the signature of the command it feeds before anything runs
(``dry_run: true`` stops after that check), so a config for a GPU machine with a hub connection
can be checked offline.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional

from rich.console import Console

from planlm.commands import load_command
from planlm.console import fmt_seconds, is_verbose, stage_console
from planlm.errors import PlanlmError
from planlm.evaluate.metrics import EditDistanceMetrics, PerplexityMetrics
from planlm.jsonio import to_jsonable, write_json
from planlm.pipeline.layout import BASE_LM, RunLayout
from planlm.pipeline.sections import bind_section, deep_merge
from planlm.plans.registry import kind_flag
from planlm.stage import lock_stage_dir, read_manifest, releasing_stage_locks

TERMINATED = 128 + 15  # the exit status of `planlm run` stopped by SIGTERM (a scheduler's preemption, `kill`)


class StagesFailed(PlanlmError):
    """Some stages of a run failed or were skipped; the others finished and the report was written."""

    exit_status = 1

_IO = {"prepare": {"out_dir"}, "train_planner": {"prepared_dir", "out_dir"},
       "train_lm": {"prepared_dir", "out_dir"}, "evaluate": {"model_dir", "prepared_dir", "out_dir"},
       "edit_distance": {"model_dir", "prepared_dir", "out_dir"}, "sweep": {"model_dir", "prepared_dir", "out_dir"}}


@dataclass
class Stage:
    """One unit of work of the run: a command function with its bound arguments."""

    name: str
    command: str
    kwargs: dict[str, Any]
    condition: Optional[str] = None
    seed: Optional[int] = None
    needs: list[str] = field(default_factory=list)


class RunProgress:
    """The run's own lines: which stage starts (how far the run is, the time elapsed and left) and how it ended."""

    def __init__(self, stages: list[Stage], state: dict):
        self.stages, self.state, self.start = stages, state, time.time()

    def start_line(self, index: int) -> str:
        elapsed = f"elapsed {fmt_seconds(time.time() - self.start)}{self._eta(self.stages[index:])}" if index else ""
        return f"{self._tag(index)} {self.stages[index].name}" + (f" ({elapsed})" if elapsed else "")

    def end_lines(self, index: int, outcome: str) -> tuple[str, str]:
        """(the end line on its own, its tail after the start line)."""
        return f"{self._tag(index)} {self.stages[index].name}: {outcome}", outcome

    def _tag(self, index: int) -> str:
        width = len(str(len(self.stages)))
        return f"[{index + 1:>{width}}/{len(self.stages)}]"

    def _eta(self, remaining: list[Stage]) -> str:
        """Time left from the stages of each kind that ran in this run (their mean time). A remaining stage whose
        folder is finished costs nothing once a stage of its kind was reused, its kind's time once one was rebuilt;
        without such evidence, or a measured stage of its kind, the estimate is a lower bound ("at least"), and
        nothing is said rather than a number without a basis."""
        times, reused, rebuilt = {}, set(), set()
        for info in self.state["stages"].values():
            kind = (info.get("command"), info.get("condition") is None)
            if info.get("status") == "done" and info.get("ran_now"):
                times.setdefault(kind, []).append(info["wall_time_s"])
                rebuilt.update([kind] if info.get("had_manifest") else [])
            elif info.get("status") == "done":
                reused.add(kind)
        left, bound = 0.0, False
        for stage in remaining:
            kind = (stage.command, stage.condition is None)
            finished = read_manifest(stage.kwargs["out_dir"]) is not None
            if finished and kind in reused and kind not in rebuilt:
                continue
            if kind in times and (not finished or kind in rebuilt):
                left += sum(times[kind]) / len(times[kind])
            else:
                bound = True
        return f", {'at least' if bound else 'about'} {fmt_seconds(left)} left" if left else ""


def _is_distributed(stage: Stage) -> bool:
    """Whether a training stage would start several processes (Lightning's DDP launcher)."""
    train = stage.kwargs.get("train")
    if stage.command not in ("train_lm", "train_planner") or train is None:
        return False
    devices, strategy = getattr(train, "devices", 1), str(getattr(train, "strategy", "auto"))
    if getattr(train, "num_nodes", 1) > 1 or "ddp" in strategy or "fsdp" in strategy or "deepspeed" in strategy:
        return True
    runtime = stage.kwargs.get("runtime")
    if isinstance(devices, int) or str(devices).lstrip("-").isdigit():
        count = int(devices)
        if count == -1:
            return _accelerator_count(runtime) > 1
        return count > 1
    return str(devices) == "auto" and _accelerator_count(runtime) > 1


def _accelerator_count(runtime: Any) -> int:
    import torch

    accelerator = runtime.accelerator() if runtime is not None else "auto"
    return torch.cuda.device_count() if accelerator in ("auto", "cuda") else 1


def _run_distributed(stage: Stage) -> None:
    """Run a multi-process training stage as its own `planlm` command in a child process.

    Lightning's DDP launcher starts the other ranks by re-running the current command line; for
    `planlm run` that would re-run the whole pipeline in every rank. Running the stage as a command
    of its own confines the extra ranks to that stage, and they exit with it.
    """
    import subprocess
    import tempfile

    import yaml

    config = to_jsonable(stage.kwargs)  # dataclasses (PlanConfig, AdapterSettings, ...) as plain YAML values
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(config, f)
    command = [sys.executable, "-m", "planlm.cli", stage.command.replace("_", "-"), "--config", f.name,
               "--verbose", str(is_verbose()).lower()]  # the child routes its library output as this run does
    try:
        result = subprocess.run(command)
    finally:
        Path(f.name).unlink(missing_ok=True)
    if result.returncode != 0:
        raise PlanlmError(f"{stage.name}: the distributed training command failed (exit {result.returncode}); "
                          f"its output is above; rerun `planlm run` to resume")


CONDITION_KEYS = {"name", "label", "paper", "model", "plans", "adapter", "train", "runtime", "evaluate", "planner"}


def _bind(command: str, section: Optional[dict], where: str) -> dict[str, Any]:
    """A stage's arguments from its YAML section, checked against its command's signature (less the paths)."""
    return bind_section(load_command(command), section, skip=_IO[command], where=where)


def _stage_name(what: str, name: str, seed: Optional[int]) -> str:
    return f"{what} {name}" + ("" if seed is None else f" seed{seed}")


def _check_seeds(seeds: Optional[list[int]], where: str) -> list[Optional[int]]:
    if seeds is None:
        return [None]
    if not seeds or len(set(seeds)) != len(seeds):
        raise PlanlmError(f"{where}: seeds {seeds} must list at least one seed, each once (e.g. seeds: [0, 1, 2]), "
                          f"or be left out for one run with lm.train.seed")
    return list(seeds)


def _check_conditions(conditions: list[dict], where: str) -> list[str]:
    if not conditions:
        raise PlanlmError(f"{where}: conditions is empty; list at least one LM condition (e.g. name: none)")
    names = [c.get("name") for c in conditions]
    if any(not isinstance(n, str) or not n or n.startswith("_") for n in names) or len(set(names)) != len(names):
        raise PlanlmError(f"{where}: conditions need unique names not starting with '_' (got {names})")
    for cond in conditions:
        unknown = sorted(set(cond) - CONDITION_KEYS)
        if unknown:
            raise PlanlmError(f"{where}: conditions[{cond['name']}] has unknown key(s) {unknown}; use "
                              f"{sorted(CONDITION_KEYS)}")
    return names


class RunPlanner(NamedTuple):
    """A planner of the run: the stage that trains it, its folder, and T, the horizon it is trained with (the
    plans' T of the conditions that read it, unless a condition sets its own plans.horizon)."""

    stage: str
    folder: Path
    horizon: int


def _planner_stages(layout: RunLayout, planner: dict, lm: dict, conditions: list[dict], sweeps: Optional[list[dict]],
                    where: str, seed: Optional[int],
                    prepared: tuple[str, Path]) -> tuple[list[Stage], dict[str, RunPlanner]]:
    """The planner stages and, for each condition with plans, its planner (``RunPlanner``).

    A condition's own ``planner`` section (merged over ``planner``) trains into planners/<condition>/;
    conditions whose merged sections are equal share one planner (e.g. one per horizon), and one equal
    to the shared section uses planner/. With ``seed`` (``seed_draws: method``) every planner is trained with
    ``train.seed`` = ``seed`` into the ``seed<N>/`` folder under its own, and its stages are named with it.
    ``prepared``: (the stage that writes it, the prepared folder the planners read)."""
    from planlm.jsonio import fingerprint

    def seeded(section: dict) -> dict:
        if seed is None:
            return section
        section = deep_merge(section, {})
        section.setdefault("train", {})["seed"] = seed
        return section

    def wants_planner(cond: dict) -> bool:  # a kind no code here registered fails later, where its section is bound
        return kind_flag(deep_merge(lm, cond).get("plans", {}).get("kind", "none"), "uses_planner")

    shared_name, shared_folder = "train-planner" + ("" if seed is None else f" seed{seed}"), layout.planner_at(seed)
    shared_args: dict[str, Any] = {}

    def shared() -> RunPlanner:
        if not shared_args:
            shared_args.update(_bind("train_planner", seeded(planner), f"{where}: planner"))
        return RunPlanner(shared_name, shared_folder, shared_args["model"].horizon)

    trained: dict[str, RunPlanner] = {}
    stages, used, planner_of = [], set(), {}
    for cond in conditions:
        if not wants_planner(cond):
            continue
        section = deep_merge(planner, cond.get("planner") or {})
        key = fingerprint(section)
        if key == fingerprint(planner):
            trained.setdefault(key, shared())
        elif key not in trained:
            name = cond["name"]
            args = _bind("train_planner", seeded(section), f"{where}: conditions[{name}].planner")
            trained[key] = RunPlanner(_stage_name("train-planner", name, seed), layout.own_planner(name, seed),
                                      args["model"].horizon)
            stages.append(Stage(trained[key].stage, "train_planner", {
                "prepared_dir": str(prepared[1]), "out_dir": str(trained[key].folder), **args},
                condition=name, seed=seed, needs=[prepared[0]]))
        planner_of[cond["name"]] = trained[key]
        used.add(trained[key].stage)
    if shared_name in used or sweeps:
        shared()
        stages.insert(0, Stage(shared_name, "train_planner", {
            "prepared_dir": str(prepared[1]), "out_dir": str(shared_folder), **shared_args},
            seed=seed, needs=[prepared[0]]))
    return stages, planner_of


def _base_lm_stage(layout: RunLayout, lm: dict, base_lm: dict, seed: Optional[int], where: str,
                   prepared: tuple[str, Path]) -> Stage:
    """The plain LM pretrained once per seed, the start of every condition."""
    section = deep_merge(lm, base_lm)
    section["plans"] = {"kind": "none"}
    if seed is not None:
        section.setdefault("train", {})["seed"] = seed
    return Stage(_stage_name("train-lm", BASE_LM, seed), "train_lm", {
        "prepared_dir": str(prepared[1]), "out_dir": str(layout.lm(BASE_LM, seed)),
        **_bind("train_lm", section, f"{where}: base_lm")}, seed=seed, needs=[prepared[0]])


def _condition_stages(layout: RunLayout, cond: dict, lm: dict, evaluate: dict, edit_distance: Optional[dict],
                      planner: Optional[RunPlanner], base: Optional[Stage], seed: Optional[int],
                      where: str, prepared: tuple[str, Path]) -> list[Stage]:
    """train-lm, evaluate and edit-distance of one condition and one seed, on ``prepared`` (its stage, its folder).
    A condition that reads the run's planner plans T = the planner's horizon unless it sets plans.horizon, which may
    not exceed it."""
    name, prepared_dir = cond["name"], str(prepared[1])
    section = deep_merge(lm, {k: v for k, v in cond.items() if k in ("model", "plans", "adapter", "train", "runtime")})
    plans = section.setdefault("plans", {})
    needs = [prepared[0]]
    if planner is not None and not plans.get("plans_dir"):
        if not plans.get("planner_dir"):  # the run's planner: its T unless the condition sets one within it
            plans["planner_dir"] = str(planner.folder)
            plans.setdefault("horizon", planner.horizon)
            if isinstance(plans["horizon"], int) and plans["horizon"] > planner.horizon:
                raise PlanlmError(f"{where}: conditions[{name}]: plans.horizon {plans['horizon']} exceeds the horizon "
                                  f"T={planner.horizon} its planner ({planner.stage}) is trained with; leave "
                                  f"plans.horizon unset (T={planner.horizon}) or set the planner's model.horizon to "
                                  f"{plans['horizon']}")
        needs.append(planner.stage)
    if base is not None:
        section.setdefault("model", {}).setdefault("init_from", base.kwargs["out_dir"])
        needs.append(base.name)
    if seed is not None:
        section.setdefault("train", {})["seed"] = seed
    model_dir, train_stage = str(layout.lm(name, seed)), _stage_name("train-lm", name, seed)
    stages = [Stage(train_stage, "train_lm", {
        "prepared_dir": prepared_dir, "out_dir": model_dir,
        **_bind("train_lm", section, f"{where}: conditions[{name}]")}, condition=name, seed=seed, needs=needs)]
    ev = deep_merge(evaluate, cond.get("evaluate") or {})
    stages.append(Stage(_stage_name("evaluate", name, seed), "evaluate", {
        "model_dir": model_dir, "prepared_dir": prepared_dir, "out_dir": str(layout.evaluation(name, seed)),
        **_bind("evaluate", ev, f"{where}: evaluate[{name}]")}, condition=name, seed=seed, needs=[train_stage]))
    if edit_distance is not None:
        stages.append(Stage(_stage_name("edit-distance", name, seed), "edit_distance", {
            "model_dir": model_dir, "prepared_dir": prepared_dir, "out_dir": str(layout.edit_distance(name, seed)),
            **_bind("edit_distance", edit_distance, f"{where}: edit_distance")},
            condition=name, seed=seed, needs=[train_stage]))
    return stages


def _sweep_stages(layout: RunLayout, sweeps: Optional[list[dict]], names: list[str], seed: Optional[int],
                  where: str, prepared: Path, per_seed: bool = False) -> list[Stage]:
    """The sweeps at inference, on the models of ``seed``: the first seed's into sweeps/<condition>-<kind>/, or
    with ``per_seed`` (``seed_draws: method``) this seed's into its ``seed<N>/`` folder."""
    stages = []
    for index, sweep in enumerate(sweeps or []):
        sweep = dict(sweep)
        target = sweep.pop("condition", None)
        if target not in names:
            raise PlanlmError(f"{where}: sweeps[{index}].condition {target!r} is not one of the conditions {names}")
        kind = sweep.get("kind", "num_paths")
        stages.append(Stage(_stage_name("sweep", f"{kind} {target}", seed if per_seed else None), "sweep", {
            "model_dir": str(layout.lm(target, seed)), "prepared_dir": str(prepared),
            "out_dir": str(layout.sweep(target, kind, seed if per_seed else None)),
            **_bind("sweep", sweep, f"{where}: sweeps[{index}]")},
            condition=target, seed=seed if per_seed else None, needs=[_stage_name("train-lm", target, seed)]))
    return stages


SEED_DRAWS = ("lm", "method")
"""What a seed of ``seeds`` draws: ``lm`` the LMs' training alone (the corpus, codebook and planners shared by every
seed, the sweeps on the first seed), ``method`` the codebook and the planners' training as well (each seed's own
k-means codebook and planners, its LMs reading them, and the sweeps on every seed)."""


def _check_seed_draws(seed_draws: str, seeds: Optional[list[int]], where: str) -> bool:
    """Whether each seed draws the whole method (``seed_draws: method``)."""
    if seed_draws not in SEED_DRAWS:
        raise PlanlmError(f"{where}: seed_draws {seed_draws!r} is not one of {list(SEED_DRAWS)}")
    if seed_draws == "method" and seeds is None:
        raise PlanlmError(f"{where}: seed_draws: method needs seeds (e.g. seeds: [0, 1, 2]); leave it at lm for one "
                          f"run with lm.train.seed and planner.train.seed")
    return seed_draws == "method"


def plan_stages(out: Path, prepare: dict, planner: dict, lm: dict, base_lm: Optional[dict], conditions: list[dict],
                evaluate: dict, edit_distance: Optional[dict], sweeps: Optional[list[dict]], where: str,
                seeds: Optional[list[int]] = None, seed_draws: str = "lm") -> list[Stage]:
    """Validate every section and return the stages in order (nothing runs here)."""
    layout = RunLayout(Path(out))
    names = _check_conditions(conditions, where)
    run_seeds = _check_seeds(seeds, where)
    per_seed = _check_seed_draws(seed_draws, seeds, where)
    stages = [Stage("prepare", "prepare", {"out_dir": str(layout.prepared),
                                           **_bind("prepare", prepare, f"{where}: prepare")})]
    shared = ("prepare", layout.prepared)
    if not per_seed:
        planner_stages, planner_of = _planner_stages(layout, planner, lm, conditions, sweeps, where, None, shared)
        stages += planner_stages
    for seed in run_seeds:
        prepared = _codebook_stage(layout, seed) if per_seed else None
        stages += [prepared] if prepared else []
        prepared = (prepared.name, layout.codebook(seed)) if prepared else shared
        if per_seed:
            planner_stages, planner_of = _planner_stages(layout, planner, lm, conditions, sweeps, where, seed,
                                                         prepared)
            stages += planner_stages
        base = _base_lm_stage(layout, lm, base_lm, seed, where, prepared) if base_lm else None
        stages += [base] if base else []
        for cond in conditions:
            stages += _condition_stages(layout, cond, lm, evaluate, edit_distance, planner_of.get(cond["name"]), base,
                                        seed, where, prepared)
    if per_seed:
        return stages + [stage for seed in run_seeds for stage in
                         _sweep_stages(layout, sweeps, names, seed, where, layout.codebook(seed), per_seed=True)]
    return stages + _sweep_stages(layout, sweeps, names, run_seeds[0], where, layout.prepared)


CHECKED_RECORDS = 5
"""Records of a local corpus that `planlm run` reads before anything runs (``check_corpus``)."""


def check_corpus(corpus: Any) -> None:
    """A local corpus (``prepare.corpus``, a ``CorpusConfig``) before anything runs: its path exists, and its first
    records hold the text column. One line naming the file, the record and the fix otherwise; a corpus by name (the
    embedded ones, a Hugging Face dataset) is left to `planlm prepare`."""
    from planlm.data.corpus import _SUFFIX_KIND, local_files, resolve_kind

    source = corpus.source
    looks_local = Path(source).suffix.lower() in _SUFFIX_KIND or corpus.kind in ("jsonl", "parquet", "text")
    if looks_local and not local_files(source):
        raise PlanlmError(f"prepare.corpus.source {source}: no such file (from {Path.cwd()}); set it to the path of "
                          f"your corpus (a .jsonl, .parquet or .txt file, a folder of them or a glob), e.g. "
                          f"--prepare.corpus.source data/my_articles.jsonl")
    kind = resolve_kind(corpus)
    if kind not in ("jsonl", "parquet"):
        return
    file, column = local_files(source)[0], corpus.text_column
    fix = f"set prepare.corpus.text_column to the key that holds the text (--prepare.corpus.text_column KEY)"
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            names = pq.ParquetFile(file).schema_arrow.names
        except Exception as e:  # `planlm prepare` says the same, later
            raise PlanlmError(f"{file}: not a readable Parquet file ({type(e).__name__}); fix or remove it") from e
        if column not in names:
            raise PlanlmError(f"{file}: no column {column!r} (its columns: {', '.join(names)}); {fix}")
        return
    checked = 0
    with open(file, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError as e:
                raise PlanlmError(f"{file} line {line_no}: not a JSON object ({' '.join(str(e).split())}); write "
                                  f"one JSON object per line, its text under {column!r}") from e
            if not isinstance(row, dict) or column not in row:
                keys = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
                raise PlanlmError(f"{file} line {line_no}: no {column!r} key (it has: {keys or 'none'}); {fix}")
            checked += 1
            if checked == CHECKED_RECORDS:
                return


def _codebook_stage(layout: RunLayout, seed: int) -> Stage:
    """The codebook of one seed (``seed_draws: method``): the prepared corpus with k-means drawn from ``seed``."""
    return Stage(f"codebook seed{seed}", "codebook", {"prepared_dir": str(layout.prepared), "seed": seed,
                                                      "out_dir": str(layout.codebook(seed))},
                 seed=seed, needs=["prepare"])


def _run_stage(stage: Stage, state: dict, layout: RunLayout) -> tuple[str, str]:
    """Run one stage and record it in ``state``: (status, how it ended: done, reused, rebuilt or failed, with its
    time and cause). A failing stage's traceback goes to its log under logs/; a stage of one condition that fails
    is recorded and the run goes on, a failing stage that all conditions need raises."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException  # here: `planlm run --help` stays fast

    out_path = Path(stage.kwargs["out_dir"])
    manifest_before = read_manifest(out_path)
    started = time.time()
    try:
        with releasing_stage_locks():  # those of a stage that raised, too
            _run_distributed(stage) if _is_distributed(stage) else load_command(stage.command)(**stage.kwargs)
        status, error = "done", None
    except SIGTERMException:  # Lightning's answer to SIGTERM: stop the run, the stage resumes on the next one
        _record_stop(stage, state, layout, "interrupted", "SIGTERM")
        raise SystemExit(TERMINATED) from None
    except (Exception, SystemExit) as e:  # one failed condition must not lose the others
        _append_traceback(layout.stage_log(stage.name))
        if stage.condition is None:
            _record_stop(stage, state, layout, "failed", _cause(e))
            raise
        status, error = "failed", _cause(e)
    seconds, manifest_after = time.time() - started, read_manifest(out_path)
    reused = status == "done" and manifest_before is not None and manifest_before == manifest_after
    state["stages"][stage.name] = {"status": status, "error": error, "wall_time_s": round(seconds, 2),
                                   "ran_now": not reused, "had_manifest": manifest_before is not None,
                                   "command": stage.command, "out_dir": str(out_path),
                                   "condition": stage.condition, "seed": stage.seed}
    return status, _outcome(status, error, fmt_seconds(seconds), manifest_before, manifest_after)


def _outcome(status: str, error: Optional[str], took: str, before: Optional[dict], after: Optional[dict]) -> str:
    if status == "failed":
        return f"failed after {took}: {error}"
    if before is None:
        return f"done in {took}"
    if before == after:
        return "reused"
    changed = before.get("config_fingerprint") != (after or {}).get("config_fingerprint")
    return f"rebuilt in {took} ({'its inputs or settings changed' if changed else 'damaged files'})"


def _result(stage: Stage) -> str:
    """What an evaluation measured, for its end line: perplexity (and the plans' use) or edit distance."""
    path = Path(stage.kwargs["out_dir"]) / "metrics.json"
    if stage.command not in ("evaluate", "edit_distance") or not path.is_file():
        return ""
    record = json.loads(path.read_text())
    if stage.command == "edit_distance":
        edit = EditDistanceMetrics.from_dict(record)
        return f"; edit distance {edit.edit_distance:.3f} [{edit.ci_low:.3f}, {edit.ci_high:.3f}]"
    m = PerplexityMetrics.from_dict(record)
    usage = m.plan_usage
    shuffled = (f", plans shuffled {usage.plan_usage_ppl:+.3f} [{usage.plan_usage_ci_low:+.3f}, "
                f"{usage.plan_usage_ci_high:+.3f}]" if usage else "")
    return f"; ppl {m.ppl:.3f} [{m.ci_low:.3f}, {m.ci_high:.3f}]{shuffled}"


def _append_traceback(log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as f:
        f.write(traceback.format_exc())


def _cause(error: BaseException) -> str:
    """A failed stage's cause in one line: the error's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _record_stop(stage: Stage, state: dict, layout: RunLayout, status: str, error: str) -> None:
    """Record in run_state.json the stage at which the whole run stops."""
    state["stages"][stage.name] = {"status": status, "error": error, "command": stage.command}
    write_json(layout.state, state)


def _run_stages(stages: list[Stage], state: dict, layout: RunLayout) -> None:
    """Every stage in order, each with its start and end line and its library output in logs/; one whose needs
    failed is skipped."""
    progress = RunProgress(stages, state)
    for index, stage in enumerate(stages):
        failed_needs = [n for n in stage.needs if state["stages"].get(n, {}).get("status") != "done"]
        log = None if failed_needs else layout.stage_log(stage.name)
        with stage_console(log, capture_stdout=True, join_lines=True) as out:
            out.begin(progress.start_line(index))
            if failed_needs:
                state["stages"][stage.name] = {"status": "skipped", "error": f"needs {failed_needs}",
                                               "command": stage.command, "condition": stage.condition,
                                               "seed": stage.seed}
                status, outcome = "skipped", f"skipped: needs {', '.join(failed_needs)}"
            else:
                try:
                    status, outcome = _run_stage(stage, state, layout)
                except BaseException as e:  # the run stops here: end the stage's line first
                    info = state["stages"].get(stage.name, {})
                    out.end(*progress.end_lines(index, f"{info.get('status', 'stopped')}: "
                                                       f"{info.get('error') or type(e).__name__}"), style="red")
                    raise
            out.end(*progress.end_lines(index, outcome + _result(stage)), style=None if status == "done" else "red")
            if stage.command == "prepare" and status == "done" and outcome != "reused":
                from planlm.data.prepare import summary

                out.line(summary(Path(stage.kwargs["out_dir"])))
        write_json(layout.state, state)


def run(out_dir: str = "runs/demo", prepare: Optional[dict] = None, planner: Optional[dict] = None,
        lm: Optional[dict] = None, base_lm: Optional[dict] = None, conditions: Optional[list[dict]] = None,
        evaluate: Optional[dict] = None, edit_distance: Optional[dict] = None, sweeps: Optional[list[dict]] = None,
        seeds: Optional[list[int]] = None, seed_draws: str = "lm", report: Optional[dict] = None,
        dry_run: bool = False) -> Path:
    """Run the whole pipeline: prepare, train the planner, train one LM per condition, evaluate, report.

    Every section holds the arguments of the command it feeds (see `planlm CMD --help`); paths between
    stages are filled in. Rerunning the same config reuses finished stages, resumes interrupted ones and
    rebuilds damaged ones. Exit status: 0 when every stage finished; 1 when a stage failed or was skipped
    (the others still run; each is printed at the end with its cause); 2 on a bad config; 143 on SIGTERM.

    Args:
        out_dir: Run folder; every stage writes a subfolder, the report lands at its top.
        prepare: Arguments of `planlm prepare` (corpus, sentences, embedding, actions, tokenizer).
        planner: Arguments of `planlm train-planner` (model, train).
        lm: Arguments of `planlm train-lm` shared by all conditions (model, plans, adapter, train).
        base_lm: Optional `train-lm` overrides for a plain LM trained once and used as the start of every
            condition (for from-scratch LMs; leave empty when `lm.model.name_or_path` is a pretrained LM).
        conditions: One LM per entry: {name, label, paper (a row of the paper's table to show beside),
            model/plans/adapter/train (merged over `lm`), evaluate (merged over `evaluate`), planner (merged
            over `planner`: this condition gets a planner of its own, e.g. {model: {dynamics: causal}})}.
        evaluate: Arguments of `planlm evaluate` shared by all conditions (split, stride, max_articles ...).
        edit_distance: Arguments of `planlm edit-distance`, run for every condition; null to skip.
        sweeps: Sweeps at inference, each the arguments of `planlm sweep` (kind: num_paths or temperature)
            plus `condition` (the LM swept, of the first seed); empty to skip.
        seeds: Training seeds, e.g. [0, 1, 2]: the base LM and every condition are trained and evaluated once
            per seed (lm/<condition>/seed<N>/, eval/<condition>/seed<N>/ ...) and the report gives the mean and
            spread over seeds; adding a seed trains only the new one. Unset: one run with lm.train.seed.
        seed_draws: What a seed draws. ``lm``: the LMs' training alone; the prepared corpus and the planners are
            shared by every seed and the sweeps run on the first seed's models. ``method``: the codebook and the
            planners too: each seed draws its own codebook (k-means seeded with it, codebooks/seed<N>/), trains
            its own planners with planner.train.seed = the seed (planner/seed<N>/, planners/<condition>/seed<N>/),
            its LMs read that seed's codebook and planners, and every
            sweep runs on every seed (sweeps/<condition>-<kind>/seed<N>/), the report pairing each point with
            the reference point with the seed-noise interval of the contrasts. Needs seeds.
        report: Options of the report: {actions_shown: int, contrasts: [[b, a], ...]} (each pair's paired
            difference ppl(b) - ppl(a) gets a row, e.g. [ours, cornille]).
        dry_run: Validate every section, check that a local corpus exists and that its first records hold the
            text column, and list the stages without running anything.
    """
    layout = RunLayout(Path(out_dir))
    conditions = conditions or []
    from planlm.pipeline.report import write_report
    from planlm.pipeline.results import check_contrasts

    check_contrasts((report or {}).get("contrasts") or [], [c.get("name") for c in conditions],
                    where=f"run {layout.root}: report.contrasts")
    stages = plan_stages(layout.root, prepare or {}, planner or {}, lm or {}, base_lm, conditions, evaluate or {},
                         edit_distance, sweeps, where=f"run {layout.root}", seeds=seeds, seed_draws=seed_draws)
    if dry_run or read_manifest(layout.prepared) is None:  # a corpus still to prepare: its path and text column
        check_corpus(stages[0].kwargs["corpus"])
    if dry_run:
        for i, stage in enumerate(stages):
            print(f"{i + 1:>2}. {stage.name}  ->  {stage.kwargs.get('out_dir', '')}")
        print(f"config valid: {len(stages)} stages (dry run: nothing was run)")
        return layout.root
    layout.root.mkdir(parents=True, exist_ok=True)
    state = {"stages": {}, "config": {"prepare": prepare, "planner": planner, "lm": lm, "base_lm": base_lm,
                                      "conditions": conditions, "evaluate": evaluate, "edit_distance": edit_distance,
                                      "sweeps": sweeps, "seeds": seeds, "report": report}}
    if seed_draws != "lm":  # the default leaves run_state.json as it was
        state["config"]["seed_draws"] = seed_draws
    with releasing_stage_locks():
        lock_stage_dir(layout.root)  # a second `planlm run` on this folder is refused with our pid
        _run_stages(stages, state, layout)
        report_path = write_report(layout.root, state=state, conditions=conditions, seeds=seeds, **(report or {}))
    console = Console(file=sys.stderr, highlight=False, soft_wrap=True)
    console.print(f"report: {report_path}", markup=False)
    _fail_if_not_done(state, layout, console)
    return layout.root


def _fail_if_not_done(state: dict, layout: RunLayout, console: Console) -> None:
    """Print each stage that did not finish with its cause, and raise StagesFailed (exit status 1) if any."""
    failed = {name: info for name, info in state["stages"].items() if info["status"] != "done"}
    for name, info in failed.items():
        log = layout.stage_log(name)
        where = f" (traceback: {log})" if info["status"] == "failed" and log.is_file() else ""
        console.print(f"{name}: {info['status']}: {info['error']}{where}", style="red", markup=False)
    if failed:
        raise StagesFailed(f"{len(failed)} of {len(state['stages'])} stages did not finish ({', '.join(failed)}; "
                           f"causes above); fix them and rerun `planlm run` (finished stages are reused)")
