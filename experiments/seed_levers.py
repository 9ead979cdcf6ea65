"""Which training lever cuts the seed-to-seed spread of the paired differences? Measured on validation only.

The demo's recipe (``configs/demo.yaml``) with two conditions, Fixed and oracle, whose paired difference had the
largest LM-seed spread of the demo's contrasts, at ``--seeds`` LM seeds (``experiments/seed_levers.yaml``). Every
lever trains the same conditions from the same base LMs (one per seed, shared), on the same windows in the same
order, and is scored on the validation split; the test split is never read. The levers:

- ``constant``: the recipe as it is (linear warm-up, then a constant rate; the best of the epochs by val/loss);
- ``cosine``: the same warm-up, then a cosine decay of the rate to 0 at the last step (a lower final rate);
- ``ema``: the constant recipe with an exponential moving average of the weights (decay ``--ema_decay``, Lightning's
  ``EMAWeightAveraging``), which validation, the best checkpoint and the saved LM use;
- ``epochs``: the constant recipe trained for ``--epochs`` epochs per condition instead of the demo's 3;
- a larger evaluation set: from the ``constant`` run's per-document values, the share of the seed variance that is a
  seed x document interaction, which more documents average away (``seed_by_document``).

The levers are applied to ``train_lm`` from here (the product has no option for them until one earns it); every
lever's run folder links the ``constant`` run's prepared corpus and base LMs.

    python experiments/seed_levers.py --out_dir runs/seed-levers

Prints the table and writes ``--out_dir``/summary.json. Finished stages are reused when rerun.
"""

from __future__ import annotations

import argparse
import json
import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LEVERS = ("constant", "cosine", "ema", "epochs")


@contextmanager
def lever(name: str, ema_decay: float):
    """``train_lm`` with the lever ``name`` applied while inside."""
    import lightning as L
    import torch

    import planlm.train.lm as lm_stage
    from planlm.train.lm_module import LightningLM

    configure, build_trainer = LightningLM.configure_optimizers, lm_stage.build_trainer

    def cosine(self):
        optimizers = configure(self)
        optimizer, warmup = optimizers["optimizer"], max(1, self.warmup_steps)
        total = max(warmup + 1, int(self.trainer.estimated_stepping_batches))

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup + 1) / (total - warmup))))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def with_ema(*args, **kwargs):
        trainer, best = build_trainer(*args, **kwargs)
        trainer.callbacks.append(L.pytorch.callbacks.EMAWeightAveraging(decay=ema_decay))
        best.save_weights_only = False  # the callback puts the average into a checkpoint's state_dict only when
        return trainer, best            # the callbacks' save hooks run, which a weights-only checkpoint skips

    if name == "cosine":
        LightningLM.configure_optimizers = cosine
    elif name == "ema":
        lm_stage.build_trainer = with_ema
    try:
        yield
    finally:
        LightningLM.configure_optimizers, lm_stage.build_trainer = configure, build_trainer


def longer(epochs: int, path: Path) -> str:
    """``path``: the demo's ``lm`` section with ``epochs`` epochs per condition, a --config (a config replaces whole
    sections; the base LM's own ``base_lm`` section keeps its single epoch, so the base LMs are shared)."""
    import yaml

    lm = yaml.safe_load((ROOT / "configs/demo.yaml").read_text())["lm"]
    lm["train"]["max_epochs"] = epochs
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"lm": lm}))
    return str(path)


def run_lever(name: str, out_dir: Path, seeds: list[int], ema_decay: float, epochs: int) -> Path:
    """The lever's run folder, trained and evaluated (the ``constant`` run first: the others link its stages)."""
    from planlm.cli import main

    run = out_dir / name
    if name != "constant":
        (run / "lm").mkdir(parents=True, exist_ok=True)
        for link, target in ((run / "prepared", Path("..") / "constant" / "prepared"),
                             (run / "lm" / "_base", Path("../..") / "constant" / "lm" / "_base")):
            if not link.is_symlink():
                link.symlink_to(target)
    with lever(name, ema_decay):
        try:
            extra = ["--config", longer(epochs, run / "lm.yaml")] if name == "epochs" else []
            main(["run", "--config", str(ROOT / "configs/demo.yaml"), "--config",
                  str(ROOT / "experiments/seed_levers.yaml"), *extra, "--out_dir", str(run), "--seeds", json.dumps(seeds)])
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    return run


def per_seed(run: Path, seeds: list[int]) -> dict[str, list[float]]:
    """{condition: validation perplexity of each seed}, from each evaluation's metrics."""
    out = {}
    for condition in ("fixed", "oracle"):
        out[condition] = [json.loads((run / "eval" / condition / f"seed{s}" / "metrics.json").read_text())["ppl"]
                          for s in seeds]
    return out


def seed_by_document(run: Path, seeds: list[int]) -> dict:
    """How much of the seed spread of oracle - Fixed a larger evaluation set would remove.

    Per source document d and seed s, the paired difference in mean NLL per token, D[s, d]. The seed-level
    difference is sum_d w_d D[s, d] (w_d: the document's share of the tokens), whose variance over seeds is
    var_seed + sum_d w_d^2 var_interaction under D[s, d] = m + a_s + b_d + e[s, d]. The two-way table's residual
    mean square estimates var_interaction; with G times the documents (the same weights' spread) that term
    shrinks G-fold, the seed term does not."""
    import csv

    def table(condition: str, seed: int) -> dict[str, tuple[float, int]]:
        sums: dict[str, list[float]] = {}
        with open(run / "eval" / condition / f"seed{seed}" / "per_article.csv") as f:
            for row in csv.DictReader(f):
                acc = sums.setdefault(row["source"], [0.0, 0])
                acc[0] += float(row["nll_sum"])
                acc[1] += int(row["tokens"])
        return {d: (nll, tokens) for d, (nll, tokens) in sums.items()}

    tables = {(c, s): table(c, s) for c in ("fixed", "oracle") for s in seeds}  # each file read once
    docs = sorted(tables["fixed", seeds[0]])

    def per_token(condition: str, seed: int) -> np.ndarray:
        return np.array([tables[condition, seed][doc][0] / tables[condition, seed][doc][1] for doc in docs])

    d = np.stack([per_token("oracle", s) - per_token("fixed", s) for s in seeds])
    tokens = np.array([tables["fixed", seeds[0]][doc][1] for doc in docs], dtype=float)
    w = tokens / tokens.sum()
    residual = d - d.mean(axis=1, keepdims=True) - d.mean(axis=0, keepdims=True) + d.mean()
    var_interaction = float((residual ** 2).sum() / ((len(seeds) - 1) * (len(docs) - 1)))
    level = d @ w
    var_total = float(level.var(ddof=1))
    interaction_term = var_interaction * float((w ** 2).sum())
    return {"documents": len(docs), "sd_nats": var_total ** 0.5, "interaction_term": interaction_term,
            "interaction_share": interaction_term / var_total if var_total > 0 else float("nan"),
            "sd_nats_2x_documents": max(var_total - interaction_term / 2, 0.0) ** 0.5}


def spread_interval(sd: float, df: int) -> tuple[float, float]:
    """The 95% interval of a standard deviation estimated with ``df`` degrees of freedom (normal model)."""
    from scipy.stats import chi2

    return sd * math.sqrt(df / chi2.ppf(0.975, df)), sd * math.sqrt(df / chi2.ppf(0.025, df))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", type=Path, default=Path("runs/seed-levers"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--levers", nargs="+", choices=LEVERS, default=list(LEVERS))
    parser.add_argument("--ema_decay", type=float, default=0.99)
    parser.add_argument("--epochs", type=int, default=6, help="the epochs lever's epochs per condition")
    args = parser.parse_args()
    levers = ["constant", *[x for x in args.levers if x != "constant"]]
    rows, summary = [], {"seeds": args.seeds, "ema_decay": args.ema_decay, "epochs": args.epochs,
                         "split": "validation", "levers": {}}
    for name in levers:
        ppl = per_seed(run_lever(name, args.out_dir, args.seeds, args.ema_decay, args.epochs), args.seeds)
        diffs = np.array(ppl["oracle"]) - np.array(ppl["fixed"])
        sd = float(diffs.std(ddof=1))
        low, high = spread_interval(sd, len(diffs) - 1)
        summary["levers"][name] = {"ppl": ppl, "oracle_minus_fixed": diffs.tolist(), "sd": sd, "sd_ci": [low, high]}
        rows.append(f"| {name} | {np.mean(ppl['fixed']):.2f} | {np.mean(ppl['oracle']):.2f} | "
                    + " / ".join(f"{d:+.2f}" for d in diffs) + f" | {diffs.mean():+.2f} | {sd:.2f} [{low:.2f}, {high:.2f}] |")
    base = summary["levers"]["constant"]["sd"]
    print("| lever | Fixed val PPL (mean) | oracle val PPL (mean) | oracle - Fixed per seed | mean | sd over seeds [95%] |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    for name in levers[1:]:
        print(f"{name}: sd {summary['levers'][name]['sd']:.2f} vs constant {base:.2f} "
              f"(ratio {summary['levers'][name]['sd'] / base:.2f})")
    split = seed_by_document(args.out_dir / "constant", args.seeds)
    summary["evaluation_set"] = split
    print(f"a larger evaluation set (constant recipe, {split['documents']} validation documents): the seed sd of "
          f"oracle - Fixed is {split['sd_nats']:.4f} nats per token, of which the seed x document interaction makes "
          f"{split['interaction_share']:.0%} of the variance; with twice the documents: {split['sd_nats_2x_documents']:.4f}")
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
