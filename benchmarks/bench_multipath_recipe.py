"""When does the multipath adapter learn to read its plans? Recipe variants of "ours" on the mechanism benchmark.

Reuses a finished ``bench_mechanism.py`` folder: its prepared corpus, its planner, each seed's base LM and
each seed's ``sampled`` condition (T = 1, K = 10, Project and Avg), which is the reference. For every seed it
trains "ours" (T = 3, K = 10, multipath) from that seed's base LM with the variant asked for, evaluates it
on the test split, and prints its plan usage (validation loss with the plans shuffled across sentences minus
with its own, nats per token), its ReZero scalars and ours - sampled, paired over test articles, per seed
and pooled. A seed missing from the folder gets its base LM and sampled reference trained here, with the
benchmark's recipe. Results are appended to ``<bench_dir>/recipes/results.txt``.

Variants: the library's own knobs (``--epochs``, ``--multipath_lr_scale``, ``--adapter_lr``, ``--dropout``,
``--kind project_avg``: ours with the gates closed for good) and two that exist only here, for the record:
``--alpha_scale`` (the ReZero scalars' rate as a fraction of the adapter's) and ``--init`` (``zero_branches``:
the attention and feed-forward outputs of PT and ST start at zero, so each transformer starts as the
identity; ``small``: their weight matrices drawn with std 0.02).

    python benchmarks/bench_multipath_recipe.py --bench_dir runs/bench_mechanism --tag full_rate_e3 \\
        --epochs 3 --multipath_lr_scale 1.0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_mechanism as bench  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench_dir", default="runs/bench_mechanism", help="a finished bench_mechanism.py folder")
    parser.add_argument("--planner_dir", default=None, help="its planner (default <bench_dir>/planner)")
    parser.add_argument("--tag", required=True, help="the variant's folder under <bench_dir>/recipes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--adapter_lr", type=float, default=None)
    parser.add_argument("--multipath_lr_scale", type=float, default=None, help="default: the library's")
    parser.add_argument("--alpha_scale", type=float, default=1.0, help="the ReZero scalars' rate / the adapter's")
    parser.add_argument("--init", choices=["default", "zero_branches", "small"], default="default")
    parser.add_argument("--kind", choices=["multipath", "project_avg"], default="multipath")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--horizon", type=int, default=3)
    parser.add_argument("--num_paths", type=int, default=10)
    return parser.parse_args()


def patch_variants(args) -> None:
    """The two variants the library does not offer: the scalars' own rate, and another init of PT and ST."""
    import torch

    from planlm.models.adapter import MultiPath
    from planlm.train.lm_module import LightningLM

    if args.alpha_scale != 1.0:
        library_groups = LightningLM.configure_optimizers

        def configure_optimizers(self):
            """The library's groups, the ReZero scalars split off into a group of their own (in place, so
            the parameters keep their order: gradient clipping sums their norms in that order)."""
            alphas = {id(self.model.adapter.alpha_path), id(self.model.adapter.alpha_sample)}
            groups = []
            for group in library_groups(self)["optimizer"].param_groups:
                rate = group["initial_lr"]  # the rate before the warm-up's factor
                kept, scalars = ([p for p in group["params"] if (id(p) in alphas) == moved] for moved in (False, True))
                groups += [{"params": kept, "lr": rate}] if kept else []
                groups += [{"params": scalars, "lr": rate * args.alpha_scale}] if scalars else []
            optimizer = torch.optim.AdamW(groups, weight_decay=self.weight_decay)
            warmup = max(1, self.warmup_steps)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        LightningLM.configure_optimizers = configure_optimizers
    if args.init != "default":
        library_reset = MultiPath.reset_parameters

        def reset_parameters(self, codebook=None):
            library_reset(self, codebook)
            for layer in [*self.path_transformer.layers, *self.sample_transformer.layers]:
                if args.init == "zero_branches":
                    for linear in (layer.self_attn.out_proj, layer.linear2):
                        torch.nn.init.zeros_(linear.weight)
                        torch.nn.init.zeros_(linear.bias)
                else:
                    for name, weight in layer.named_parameters():
                        if weight.dim() == 2:
                            torch.nn.init.normal_(weight, std=0.02)

        MultiPath.reset_parameters = reset_parameters


def references(args, seed: int, prepared_dir: str, planner_dir: str) -> tuple[Path, Path]:
    """(base LM, evaluation of the sampled condition) of a seed: the benchmark's, or trained here alike."""
    from planlm.evaluate.perplexity import evaluate
    from planlm.models.adapter import AdapterSettings
    from planlm.plans.spec import PlanSpec
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    root = Path(args.bench_dir)
    base, sampled_eval = root / "lm" / f"_base-seed{seed}", root / "eval" / f"sampled-seed{seed}"
    if base.is_dir() and sampled_eval.is_dir():
        return base, sampled_eval
    base, sampled = root / "recipes" / "_refs" / f"_base-seed{seed}", root / "recipes" / "_refs" / f"sampled-seed{seed}"
    sampled_eval = sampled.with_name(f"eval-sampled-seed{seed}")
    window = base_window(prepared_dir)
    knobs = dict(batch_size=16, lr=2e-3, seed=seed, progress_bar=False, log_every_n_steps=10, **window)
    train_lm(prepared_dir=prepared_dir, out_dir=str(base), train=LMTrainConfig(max_epochs=2, warmup_steps=20, **knobs),
             model=LMModelConfig(model_config={"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2,
                                               "n_positions": window["context_length"]}))
    train_lm(prepared_dir=prepared_dir, out_dir=str(sampled), model=LMModelConfig(init_from=str(base)),
             plans=PlanSpec(kind="planner_sampled", num_paths=10, horizon=1, temperature=1.0, seed=seed,
                            planner_dir=planner_dir),
             adapter=AdapterSettings(kind="project_avg"),
             train=LMTrainConfig(max_epochs=3, warmup_steps=5, gradient_clip_val=1.0, **knobs))
    evaluate(model_dir=str(sampled), prepared_dir=prepared_dir, out_dir=str(sampled_eval), split="test",
             batch_size=64, bootstrap_samples=1000, **window)
    return base, sampled_eval


def base_window(prepared_dir: str) -> dict:
    """The benchmark's LM window (--lag 6): read from a base LM of the folder."""
    manifest = json.loads(next(Path(prepared_dir).parent.glob("lm/_base-seed*/manifest.json")).read_text())
    train = manifest["config"]["train"]
    return {"context_length": train["context_length"], "stride": train["stride"]}


def main() -> None:
    args = parse_args()
    import torch

    torch.set_num_threads(1)
    from planlm.data.resources import use_offline_mode_if_no_hub

    use_offline_mode_if_no_hub()
    patch_variants(args)
    from planlm.evaluate.perplexity import evaluate
    from planlm.models.adapter import AdapterSettings
    from planlm.plans.spec import PlanSpec
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    prepared_dir, planner_dir = str(Path(args.bench_dir) / "prepared"), args.planner_dir or f"{args.bench_dir}/planner"
    window, out = base_window(prepared_dir), Path(args.bench_dir) / "recipes" / args.tag
    refs = {seed: references(args, seed, prepared_dir, planner_dir) for seed in args.seeds}
    scale = {} if args.multipath_lr_scale is None else {"multipath_lr_scale": args.multipath_lr_scale}
    rows = []
    for seed in args.seeds:
        model_dir, eval_dir, began = out / f"ours-seed{seed}", out / f"eval-ours-seed{seed}", time.time()
        train_lm(prepared_dir=prepared_dir, out_dir=str(model_dir), model=LMModelConfig(init_from=str(refs[seed][0])),
                 plans=PlanSpec(kind="planner_sampled", num_paths=args.num_paths, horizon=args.horizon,
                                temperature=1.0, seed=seed, planner_dir=planner_dir),
                 adapter=AdapterSettings(kind=args.kind, dropout=args.dropout),
                 train=LMTrainConfig(batch_size=16, lr=args.lr, adapter_lr=args.adapter_lr, max_epochs=args.epochs,
                                     warmup_steps=5, gradient_clip_val=1.0, seed=seed, progress_bar=False,
                                     log_every_n_steps=10, **window, **scale))
        seconds = time.time() - began
        evaluate(model_dir=str(model_dir), prepared_dir=prepared_dir, out_dir=str(eval_dir), split="test",
                 batch_size=64, bootstrap_samples=1000, **window)
        manifest = json.loads((model_dir / "manifest.json").read_text())
        diff = bench.paired([refs[seed][1]], [eval_dir], 1000)
        rows.append(f"{args.tag} seed {seed}: ours - sampled {bench.fmt_diff(diff)}, plan usage "
                    f"{manifest['last_val_plan_usage']:.3f}, val loss {manifest['val_loss']:.4f}, alphas "
                    f"{manifest.get('rezero_alphas')}, trained in {seconds:.0f} s")
        print(rows[-1], flush=True)
    pooled = bench.paired([refs[s][1] for s in args.seeds], [out / f"eval-ours-seed{s}" for s in args.seeds], 1000)
    rows.append(f"{args.tag} pooled: ours - sampled {bench.fmt_diff(pooled)}")
    print(rows[-1])
    with open(Path(args.bench_dir) / "recipes" / "results.txt", "a") as results:
        results.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
