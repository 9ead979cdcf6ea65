"""The quality cost of the fast setting: test perplexity of fp32 with the plain loss against bf16 autocast with the
chunked loss (``planlm.speed``), paired (same corpus, seed, condition and data order), through the real commands.

On a synthetic prepared corpus (no sentence encoder), each condition (none, and oracle plans through
Project-and-Avg) and seed trains once per setting with ``train_lm`` and is scored with ``evaluate`` at the same
setting (fp32 / bf16); the table gives both perplexities and their relative difference. The training-speed
issue asks for every paired difference within 1%. The demo's own comparison is two ``planlm run``s and
``benchmarks/compare_runs.py`` (see the docs).

    python benchmarks/bench_speed_quality.py --seeds 0 1 --articles 200
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

SETTINGS = {"fp32": ("fp32", "fp32", 0), "fast": ("bf16", "bf16", 1024)}
"""name -> (train-lm precision, evaluate precision, train-lm loss_chunk_size; evaluation always chunks its NLL)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--articles", type=int, default=200, help="training articles")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--width", type=int, default=64, help="the GPT-2's width (2 layers, GPT-2 vocabulary)")
    parser.add_argument("--fast_eval_precision", choices=["bf16", "fp32"], default="bf16",
                        help="evaluate's precision in the fast setting (the training is bf16 either way)")
    args = parser.parse_args()
    SETTINGS["fast"] = ("bf16", args.fast_eval_precision, SETTINGS["fast"][2])
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(Path(tmp), args)
    print(f"test perplexity, fp32 + plain loss vs bf16 autocast + chunked loss (evaluated in "
          f"{args.fast_eval_precision}); GPT-2 2 x {args.width}, "
          f"{args.epochs} epochs on {args.articles} synthetic articles")
    print(f"| {'condition':<9} | seed | {'ppl fp32':>9} | {'ppl fast':>9} | {'fast / fp32 - 1':>15} |")
    print(f"|{'-' * 11}|------|{'-' * 11}|{'-' * 11}|{'-' * 17}|")
    for condition, seed, fp32, fast in rows:
        print(f"| {condition:<9} | {seed:>4} | {fp32:>9.3f} | {fast:>9.3f} | {fast / fp32 - 1:>+14.3%} |")
    worst = max(abs(fast / fp32 - 1) for _, _, fp32, fast in rows)
    print(f"largest paired difference: {worst:.3%} ({'within' if worst <= 0.01 else 'NOT within'} 1%)")


def run(root: Path, args) -> list[tuple[str, int, float, float]]:
    from planlm.args import LMRuntime, Runtime
    from planlm.evaluate.perplexity import evaluate
    from planlm.models.adapter import AdapterSettings
    from planlm.plans.config import PlanConfig
    from planlm.testing.synthetic import make_synthetic_prepared
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    prepared = make_synthetic_prepared(root / "prepared", rule="random", num_articles={
        "train": args.articles, "validation": max(10, args.articles // 10), "test": max(20, args.articles // 5)})
    model = LMModelConfig(model_config={"model_type": "gpt2", "n_layer": 2, "n_embd": args.width, "n_head": 2,
                                        "n_positions": 128})
    conditions = {"none": PlanConfig(kind="none"), "oracle": PlanConfig(kind="oracle", num_paths=1, horizon=1)}
    rows = []
    for seed in args.seeds:
        for condition, plans in conditions.items():
            ppl = {}
            for name, (train_precision, eval_precision, chunk) in SETTINGS.items():
                folder = root / f"{condition}-{seed}-{name}"
                train = LMTrainConfig(batch_size=8, lr=1e-3, max_epochs=args.epochs, seed=seed,
                                      loggers=["csv"])
                train_lm(str(prepared), str(folder / "lm"), model, plans, AdapterSettings(kind="project_avg"), train,
                         runtime=LMRuntime(device="cpu", precision=train_precision, loss_chunk_size=chunk))
                metrics = evaluate(str(folder / "lm"), str(prepared), str(folder / "eval"), stride=64,
                                   bootstrap_samples=10, runtime=Runtime(device="cpu", precision=eval_precision))
                ppl[name] = metrics.ppl
            rows.append((condition, seed, ppl["fp32"], ppl["fast"]))
            print(f"{condition} seed {seed}: ppl fp32 {ppl['fp32']:.4f}, fast {ppl['fast']:.4f}", flush=True)
    return rows


if __name__ == "__main__":
    main()
