"""Train and evaluate one variant of a finished demo condition, paired with the run's own conditions.

A variant is a condition of a finished ``planlm run`` folder with some of its ``train-lm`` sections changed (the
adapter, the training recipe). It starts from the same seed's base LM, reads the same cached plans, sees the same
windows in the same order, and is evaluated on the same test articles as the run's conditions, so its difference
from any of them is paired. It is written under ``<run>/variants/<name>/{lm,eval}/seed<S>`` and never touches
the run's own folders. Compare it afterwards with ``planlm compare`` against the run's evaluations.

    python -m experiments.demo_variant runs/demo-bigplanner --condition ours --name ours_window3_planner \
        --set plans.planner_dir=runs/planner_recipe/max_sentences-3/n2325-seed0 --seeds 0 1

Each stage is a ``planlm train-lm`` / ``planlm evaluate`` call with the condition's recorded config (the LM's
manifest and the evaluation's manifest), so a finished variant is reused and an interrupted one resumes. A key
that an earlier planlm recorded and ``train-lm`` no longer takes (lab/removed-options.md) is left out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from planlm.train.args import recorded_runtime


def variant_config(run: Path, condition: str, seed: int, changes: list[str]) -> dict:
    """The ``train-lm`` arguments of ``condition``'s seed, with ``section.key=value`` changes (values as YAML)."""
    from dataclasses import fields

    from planlm.models.adapter import AdapterSettings
    from planlm.plans.config import PlanConfig
    from planlm.train.lm import LMModelConfig, LMTrainConfig

    config = json.loads((run / "lm" / condition / f"seed{seed}" / "manifest.json").read_text())["config"]
    args = {name: dict(config[name]) for name in ("model", "plans", "adapter", "train")}
    args["train"], args["runtime"] = recorded_runtime(args["train"])
    taken = {"model": LMModelConfig, "plans": PlanConfig, "adapter": AdapterSettings, "train": LMTrainConfig}
    for section, group in taken.items():  # the keys train-lm takes now
        args[section] = {key: value for key, value in args[section].items()
                         if key in {knob.name for knob in fields(group)}}
    for change in changes:
        key, value = change.split("=", 1)
        section, name = key.split(".", 1)
        args[section][name] = yaml.safe_load(value)
    return args


def evaluate_args(run: Path, condition: str, seed: int) -> list[str]:
    """The ``evaluate`` options the run used for ``condition``'s seed (split, stride, context)."""
    config = json.loads((run / "eval" / condition / f"seed{seed}" / "manifest.json").read_text())["config"]
    return ["--split", config["split"], "--stride", str(config["stride"]),
            "--context_length", str(config["context_length"]), "--runtime.precision", config["precision"]]


def run_variant(run: Path, condition: str, name: str, seed: int, changes: list[str], speed: list[str]) -> Path:
    """Train and evaluate ``name`` for one seed; returns its evaluation folder."""
    out = run / "variants" / name
    lm_dir, eval_dir = out / "lm" / f"seed{seed}", out / "eval" / f"seed{seed}"
    config_path = out / f"train-lm-seed{seed}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(variant_config(run, condition, seed, changes), sort_keys=False))
    prepared = str(run / "prepared")
    subprocess.run(["planlm", "train-lm", "--config", str(config_path), "--prepared_dir", prepared,
                    "--out_dir", str(lm_dir), *speed], check=True)
    subprocess.run(["planlm", "evaluate", "--model_dir", str(lm_dir), "--prepared_dir", prepared,
                    "--out_dir", str(eval_dir), *evaluate_args(run, condition, seed)], check=True)
    alphas = json.loads((lm_dir / "manifest.json").read_text()).get("rezero_alphas")
    print(f"{name} seed {seed}: {eval_dir} (ReZero alphas {alphas})", flush=True)
    return eval_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a finished planlm run folder")
    parser.add_argument("--condition", required=True, help="the run's condition the variant starts from")
    parser.add_argument("--name", required=True, help="the variant's folder under <run>/variants")
    parser.add_argument("--set", nargs="+", default=[], dest="changes", help="section.key=value (YAML values)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--speed", nargs="*", default=["--runtime.compile_loss", "true"],
                        help="train-lm speed options as the run set them (not in the LM's manifest; the demo's default)")
    args = parser.parse_args(argv)
    for seed in args.seeds:
        run_variant(args.run, args.condition, args.name, seed, args.changes, args.speed)


if __name__ == "__main__":
    sys.exit(main())
