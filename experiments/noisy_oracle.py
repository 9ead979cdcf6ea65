"""How the LM's gain follows the information of its plans, with a known answer: noisy oracle plans.

A planner's information (unigram NLL - planner NLL of the next action) is what it knows beyond the action
frequencies. Does the LM's gain over Fixed follow it? This experiment builds plans whose information is known and
set by one number: the **noisy oracle** keeps each sentence's true action with probability ``keep`` and replaces it
otherwise by a draw from the training unigram u. Given such a plan b, the posterior of the true action is exactly
``keep * [a = b] + (1 - keep) * u(a)``, so its information is measured on the validation split the way the
planner summary measures a planner's. The noise is drawn once per sentence (the same plans in every epoch and
for every LM seed, as a plan cache is), independent of the text, so whatever the plan knows is news to the LM only
as far as the true action is.

Each level trains the run's ``oracle`` condition (T = 1, K = 1, Project and Avg) with the noisy plans instead: the
same seed's base LM, the same windows in the same order, the same test articles, so every LM is paired with the
run's conditions. Written under ``<run>/variants/noisy_oracle_<keep%>/`` (``experiments/demo_variant.py``'s
layout), never touching the run's folders.

    python -m experiments.noisy_oracle runs/demo-bigplanner --keep 0.25 0.5 0.75 --seeds 0 1 \\
        --out experiments/results/noisy_oracle

Writes ``<out>.md``: each level's information (validation, nats), its paired difference from Fixed and the share
of the oracle's gain, beside the run's planned conditions and their planners' step-1 information.
"""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import numpy as np
import yaml

from experiments.demo_variant import evaluate_args, variant_config
from experiments.planner_size_gain import PLANNED, read_run
from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.evaluate.bootstrap import compare_evaluations
from planlm.plans.kinds import PlanKind
from planlm.plans.registry import KINDS, register_plan_kind
from planlm.plans.sources import OraclePlans, Plans, TablePlans


def training_unigram(prepared: PreparedDataset) -> np.ndarray:
    """u (A,): the planner split's action frequencies, add-one smoothed (the planner summary's unigram)."""
    counts = np.bincount(np.asarray(prepared[prepared.planner_split].actions), minlength=prepared.num_actions)
    return (counts + 1) / (counts.sum() + prepared.num_actions)


def noisy_actions(split: PreparedSplit, unigram: np.ndarray, keep: float, seed: int) -> np.ndarray:
    """Each sentence's action of ``split`` (N_sent,): the true one with probability ``keep``, else a unigram draw;
    drawn once per split and seed (the split's folder name seeds it), so every read gives the same plans."""
    rng = np.random.default_rng([seed, zlib.crc32(Path(split.path).name.encode())])
    kept = rng.random(split.num_sentences) < keep
    drawn = rng.choice(len(unigram), size=split.num_sentences, p=unigram)
    return np.where(kept, np.asarray(split.actions), drawn)


class NoisyOracle(PlanKind):
    """The oracle's plans with each true action kept with probability ``keep``, else replaced by a unigram draw."""

    reads_future = True

    def __init__(self, keep: float):
        self.keep = keep
        self.name = f"noisy_oracle_{round(keep * 100)}"

    def _source(self, plans, prepared: PreparedDataset, split: PreparedSplit) -> OraclePlans:
        oracle = OraclePlans(split, plans.num_paths, plans.horizon)
        oracle.actions = noisy_actions(split, training_unigram(prepared), self.keep, plans.seed)  # (N_sent,)
        return oracle

    def plan(self, boundaries, plans, rng, planner=None) -> Plans:
        raise NotImplementedError("noisy oracle plans are read per split (source), not made for free text")

    def source(self, plans, prepared, split, sentences, *_) -> TablePlans:
        made = self._source(plans, prepared, split)(sentences)
        return TablePlans(made, sentences, split.num_sentences)


def information(prepared: PreparedDataset, keep: float, seed: int = 0, split: str = "validation") -> dict:
    """The noisy plan's information about the true action on ``split``: unigram NLL - NLL of the posterior
    keep * [a = b] + (1 - keep) * u(a), in nats per sentence (every sentence is a boundary)."""
    unigram = training_unigram(prepared)
    view = prepared[split]
    true = np.asarray(view.actions)
    plan = noisy_actions(view, unigram, keep, seed)
    posterior = keep * (plan == true) + (1 - keep) * unigram[true]
    unigram_nll, plan_nll = float(-np.log(unigram[true]).mean()), float(-np.log(posterior).mean())
    return {"keep": keep, "unigram_nll": unigram_nll, "nll": plan_nll, "information": unigram_nll - plan_nll,
            "agreement": float((plan == true).mean())}


def run_level(run: Path, keep: float, seed: int, speed: list[str]) -> Path:
    """Train and evaluate the oracle condition with noisy plans for one seed (in process: the kind is registered
    here); returns its evaluation folder."""
    from planlm.cli import main as planlm

    kind = register_plan_kind(NoisyOracle(keep)).name
    out = run / "variants" / kind
    lm_dir, eval_dir = out / "lm" / f"seed{seed}", out / "eval" / f"seed{seed}"
    config_path = out / f"train-lm-seed{seed}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(variant_config(run, "oracle", seed, [f"plans.kind={kind}"]), sort_keys=False))
    prepared = str(run / "prepared")
    planlm(["train-lm", "--config", str(config_path), "--prepared_dir", prepared, "--out_dir", str(lm_dir), *speed])
    planlm(["evaluate", "--model_dir", str(lm_dir), "--prepared_dir", prepared, "--out_dir", str(eval_dir),
            *evaluate_args(run, "oracle", seed)])
    return out / "eval"


def _row(label: str, info: float | None, versus_fixed: dict, oracle_gain: float) -> str:
    share = versus_fixed["diff"] / oracle_gain
    info_text = "" if info is None else f"{info:.3f}"
    seeds = ", ".join(f"{r['diff']:+.2f}" for r in (versus_fixed.get("seeds") or {}).values())
    return (f"| {label} | {info_text} | {versus_fixed['diff']:+.2f} [{versus_fixed['ci_low']:+.2f}, "
            f"{versus_fixed['ci_high']:+.2f}] ({seeds}) | {share:.0%} |")


def report(run: Path, levels: dict[float, Path], infos: dict[float, dict]) -> list[str]:
    """The table: information and paired gain over Fixed of every noisy level, the run's planned rows and the oracle."""
    fixed = run / "eval" / "fixed"
    oracle = compare_evaluations(fixed, run / "eval" / "oracle")
    planner_info = read_run(run)["info"]
    lines = [f"Run `{run}`; paired with its Fixed condition over seeds and documents (t on S - 1 df for the seed "
             f"spread, in quadrature with the document bootstrap).", "",
             "| plans | information about the next action (nats, validation) | PPL - Fixed [95% CI] (seeds) | "
             "share of the oracle's gain |", "|---|---|---|---|"]
    for keep, folder in sorted(levels.items()):
        lines.append(_row(f"noisy oracle, keep {keep:.2f} (agreement {infos[keep]['agreement']:.2f})",
                          infos[keep]["information"], compare_evaluations(fixed, folder), oracle["diff"]))
    for name, planner in PLANNED.items():
        if (run / "eval" / name).is_dir():
            lines.append(_row(f"{name} (planner `{planner}`, step 1)", planner_info.get(planner),
                              compare_evaluations(fixed, run / "eval" / name), oracle["diff"]))
    lines.append(_row("oracle", infos["oracle"]["information"], oracle, oracle["diff"]))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a finished planlm run folder with fixed and oracle conditions")
    parser.add_argument("--keep", nargs="+", type=float, default=[0.25, 0.5, 0.75])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--speed", nargs="*", default=["--runtime.compile_loss", "true"])
    parser.add_argument("--out", type=Path, default=None, help="write <out>.md and <out>.json")
    args = parser.parse_args(argv)
    prepared = PreparedDataset(args.run / "prepared")
    infos = {keep: information(prepared, keep) for keep in args.keep}
    infos["oracle"] = information(prepared, 1.0)
    levels = {}
    for keep in args.keep:
        for seed in args.seeds:
            levels[keep] = run_level(args.run, keep, seed, args.speed)
    lines = report(args.run, levels, infos)
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text("\n".join([f"# Noisy oracle plans: LM gain against plan information",
                                                          "", *lines, ""]))
        args.out.with_suffix(".json").write_text(json.dumps({str(k): v for k, v in infos.items()}, indent=2))
    for keep in args.keep:
        KINDS.pop(f"noisy_oracle_{round(keep * 100)}", None)


if __name__ == "__main__":
    main()
