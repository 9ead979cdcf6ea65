"""Why the multipath adapter's ReZero gates stay shut on real text: what its transformers would add.

A trained multipath LM (e.g. the demo's ``lm/ours/seed0``) is scored on a split with its own plans while its
gates alpha_1 (PathTransformer) and alpha_2 (SampleTransformer) are forced to chosen values: 0 is Project and Avg
over the same paths (the transformers switched off), ``trained`` the learned values, larger values open them.
If opening the gates makes perplexity worse, the transformers' outputs carry nothing the LM can use yet, and
the gradient keeps the gates near 0; if it makes it better, something else keeps them shut (their learning
rate, the noise of their gradient). Beside it: the norms of what each transformer adds to the plan vector at
gate 1, against the Project-and-Avg vector it is added to and a token embedding (over random paths).

    python experiments/probe_gates.py runs/demo/lm/ours/seed0 runs/demo/prepared --split validation

The split defaults to validation: a diagnosis, not a result of the test table.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from planlm.evaluate.loading import load_checked
from planlm.evaluate.perplexity import evaluate_split
from planlm.plans.config import PlanConfig, evaluation_plans

GATES = ("alpha_path", "alpha_sample")


def perplexity(model, prepared, split, plans, args) -> float:
    result = evaluate_split(model, prepared, split, plans, split.num_articles, args.stride, 128, 64, "cpu", "fp32")
    return float(np.exp(np.sum(result["nll_sums"]) / np.sum(result["tokens"])))


def what_the_transformers_add(adapter, paths: torch.Tensor) -> dict[str, float]:
    """Mean norms over ``paths`` (N, K, T) of the Project-and-Avg plan and of each gate's term (with gate 1)."""
    saved = [getattr(adapter, g).detach().clone() for g in GATES]
    norms = {}
    with torch.no_grad():
        for name, values in (("project_avg", (0.0, 0.0)), ("path_term", (1.0, 0.0)), ("both_terms", (1.0, 1.0))):
            for gate, value in zip(GATES, values):
                getattr(adapter, gate).fill_(value)
            norms[name] = adapter(paths)
        for gate, value in zip(GATES, saved):
            getattr(adapter, gate).copy_(value)
    base = norms["project_avg"]
    return {"|c Project and Avg|": float(base.norm(dim=-1).mean()),
            "|PT term| (alpha_1 = 1)": float((norms["path_term"] - base).norm(dim=-1).mean()),
            "|ST term| (alpha_2 = 1)": float((norms["both_terms"] - norms["path_term"]).norm(dim=-1).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("prepared_dir")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--stride", type=int, default=64)
    parser.add_argument("--values", type=float, nargs="+", default=[0.0, 0.01, 0.03, 0.1, 0.3, 1.0])
    args = parser.parse_args()
    torch.manual_seed(0)
    prepared, split, model = load_checked(args.model_dir, args.prepared_dir, args.split)
    plans = evaluation_plans(PlanConfig(), model, args.model_dir)
    adapter = model.adapter
    trained = {g: float(getattr(adapter, g).detach()) for g in GATES}
    print(f"{args.model_dir}: trained alpha_1 {trained['alpha_path']:+.4f}, alpha_2 {trained['alpha_sample']:+.4f}; "
          f"{split.num_articles} {args.split} articles, stride {args.stride}, plans {plans.kind} K={plans.num_paths} "
          f"T={plans.horizon}")
    rows = [("trained", trained["alpha_path"], trained["alpha_sample"])]
    rows += [(f"both {v:g}", v, v) for v in args.values]
    rows += [(f"alpha_1 only {v:g}", v, 0.0) for v in args.values if v > 0.05]
    rows += [(f"alpha_2 only {v:g}", 0.0, v) for v in args.values if v > 0.05]
    print("\n| gates | alpha_1 | alpha_2 | PPL | PPL - trained |\n|---|---|---|---|---|")
    reference = None
    for name, alpha_1, alpha_2 in rows:
        with torch.no_grad():
            adapter.alpha_path.fill_(alpha_1)
            adapter.alpha_sample.fill_(alpha_2)
        ppl = perplexity(model, prepared, split, plans, args)
        reference = ppl if reference is None else reference
        print(f"| {name} | {alpha_1:+.4f} | {alpha_2:+.4f} | {ppl:.3f} | {ppl - reference:+.3f} |", flush=True)
    with torch.no_grad():
        adapter.alpha_path.fill_(trained["alpha_path"])
        adapter.alpha_sample.fill_(trained["alpha_sample"])
    paths = torch.randint(0, prepared.num_actions, (256, plans.num_paths, plans.horizon))
    print("\nNorms over 256 random paths (the plan vector is added to token embeddings):")
    for name, value in what_the_transformers_add(adapter, paths).items():
        print(f"- {name}: {value:.4f}")
    token_norm = float(model.lm.get_input_embeddings().weight.norm(dim=-1).mean())
    print(f"- a token embedding row: {token_norm:.4f}")


if __name__ == "__main__":
    main()
