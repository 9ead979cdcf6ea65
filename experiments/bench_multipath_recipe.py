"""When does the multipath adapter learn to read its plans? Recipe variants of "ours" on the mechanism benchmark.

Reuses a finished ``bench_mechanism.py`` folder: its prepared corpus, its planner, each seed's base LM and
each seed's ``sampled`` condition (T = 1, K = 10, Project and Avg), which is the reference. For every seed it
trains "ours" from that seed's base LM with the variant asked for, under ``<out_dir>/recipes/<tag>``,
evaluates it on the test split, and prints its plan usage (validation loss with the plans shuffled across
sentences minus with its own, nats per token), its ReZero scalars and ours - sampled, paired over test
articles, per seed and pooled. A seed missing from the folder gets its base LM and sampled reference
trained here (``<out_dir>/recipes/_refs``). Results are appended to ``<out_dir>/recipes/results.txt``.

Every ``bench_mechanism.py`` option applies and means what it means there (``--out_dir`` names the finished
folder; ``--seeds``, ``--epochs``, ``--multipath_lr_scale``, ``--horizon``, ...; the options it was run with,
such as ``--lag``, must be given again). Variants of the adapter: ``--kind project_avg`` (ours with the gates
shut for good), and these, which the library does not offer, for the record: ``--dropout`` (inside PT and ST),
``--alpha_scale`` (the ReZero scalars' rate as a fraction of the adapter's) and ``--init`` (``zero_branches``: the
attention and feed-forward outputs of PT and ST start at zero, so each transformer starts as the identity;
``small``: their weight matrices drawn with std 0.02).

    python experiments/bench_multipath_recipe.py --out_dir runs/bench_mechanism --recipe full_rate_e3 \
        --epochs 3 --multipath_lr_scale 1.0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

try:  # imported as the package `experiments` (the tests, python -m experiments.bench_multipath_recipe)
    from experiments import bench_mechanism as bench
except ImportError:  # run as a script (python experiments/bench_multipath_recipe.py): its folder is sys.path[0]
    import bench_mechanism as bench


def parse_args() -> tuple[argparse.Namespace, argparse.Namespace]:
    """(this script's options, the benchmark's options)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, help="the variant's folder under <out_dir>/recipes")
    parser.add_argument("--alpha_scale", type=float, default=1.0, help="the ReZero scalars' rate / the adapter's")
    parser.add_argument("--init", choices=["default", "zero_branches", "small"], default="default")
    parser.add_argument("--kind", choices=["multipath", "project_avg"], default="multipath")
    parser.add_argument("--dropout", type=float, default=0.0)
    args, bench_argv = parser.parse_known_args()
    return args, bench.parse_args(bench_argv)


def patch_variants(args) -> None:
    """The variants the library does not offer: dropout in PT and ST, the scalars' own rate, and another init of PT
    and ST."""
    import torch

    from planlm.models import adapter as adapter_module
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
    if args.dropout:
        library_encoder = adapter_module._encoder

        def encoder_with_dropout(config):  # as nn.TransformerEncoderLayer(dropout=...) builds it
            stack = library_encoder(config)
            for layer in stack.layers:
                for module in (layer.dropout, layer.dropout1, layer.dropout2):
                    module.p = args.dropout
                layer.self_attn.dropout = args.dropout
            return stack

        adapter_module._encoder = encoder_with_dropout
    if args.init != "default":
        library_reset = MultiPath.reset_parameters

        def reset_parameters(self, codebook=None):
            library_reset(self, codebook)
            for layer in [*self.path_transformer.layers, *self.sample_transformer.layers]:
                if args.init == "zero_branches":  # each transformer starts as the identity (pre-norm residuals)
                    for branch_out in (layer.self_attn.out_proj, layer.linear2):
                        torch.nn.init.zeros_(branch_out.weight)
                        torch.nn.init.zeros_(branch_out.bias)
                    continue
                for name, weight in layer.named_parameters():
                    if weight.dim() == 2:
                        torch.nn.init.normal_(weight, std=0.02)

        MultiPath.reset_parameters = reset_parameters


def references(bench_args, seed: int, prepared_dir: str, planner_dir: str) -> tuple[Path, Path]:
    """(base LM, evaluation of the sampled condition) of a seed: the benchmark's, or trained here alike."""
    root = Path(bench_args.out_dir)
    base, sampled_eval = root / "lm" / f"_base-seed{seed}", root / "eval" / f"sampled-seed{seed}"
    if base.is_dir() and sampled_eval.is_dir():
        return base, sampled_eval
    refs = argparse.Namespace(**{**vars(bench_args), "tag": "recipes/_refs"})
    base = bench.train_base(refs, seed, prepared_dir, bench.Clock())
    return base, bench.train_condition(refs, "sampled", seed, prepared_dir, planner_dir, base, bench.Clock())[0]


def main() -> None:
    args, bench_args = parse_args()
    import torch

    torch.set_num_threads(bench_args.threads)
    from planlm.data.resources import use_offline_mode_if_no_hub

    use_offline_mode_if_no_hub()
    patch_variants(args)
    from planlm.models.adapter import AdapterSettings

    root = Path(bench_args.out_dir)
    prepared_dir, planner_dir = str(root / "prepared"), bench_args.planner_dir or str(root / "planner")
    refs = {seed: references(bench_args, seed, prepared_dir, planner_dir) for seed in bench_args.seeds}
    variant = argparse.Namespace(**{**vars(bench_args), "tag": f"recipes/{args.recipe}"})
    rows, evals = [], []
    for seed in bench_args.seeds:
        began = time.time()
        eval_dir, _ = bench.train_condition(variant, "ours", seed, prepared_dir, planner_dir, refs[seed][0],
                                            bench.Clock(), adapter=AdapterSettings(kind=args.kind))
        seconds, evals = time.time() - began, evals + [eval_dir]
        manifest = json.loads((root / variant.tag / "lm" / f"ours-seed{seed}" / "manifest.json").read_text())
        diff = bench.paired([refs[seed][1]], [eval_dir], bench_args.bootstrap_samples)
        rows.append(f"{args.recipe} seed {seed}: ours - sampled {bench.fmt_diff(diff)}, plan usage "
                    f"{manifest['last_val_plan_usage']:.3f}, val loss {manifest['val_loss']:.4f}, alphas "
                    f"{manifest.get('rezero_alphas')}, trained and evaluated in {seconds:.0f} s")
        print(rows[-1], flush=True)
    pooled = bench.paired([refs[s][1] for s in bench_args.seeds], evals, bench_args.bootstrap_samples)
    rows.append(f"{args.recipe} pooled: ours - sampled {bench.fmt_diff(pooled)}")
    print(rows[-1])
    with open(root / "recipes" / "results.txt", "a") as results:
        results.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
