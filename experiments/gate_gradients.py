"""Why the ReZero gates stay shut: the gradient that reaches alpha_1 and alpha_2, batch by batch.

Adam moves a parameter by about lr x m / sqrt(v) per step, where m and v are running means of its gradient and
of its square. For one scalar such as a gate that is lr x E[g] / sqrt(E[g^2]): a gradient whose sign holds from
batch to batch moves the gate by lr per step whatever its size, and one that is mostly noise (|E[g]| << its
spread) leaves it where it started. This script measures, on training batches of a trained multipath LM, with
its own training plans (the run's plan cache):

- the mean gradient of each gate, its spread over batches, the ratio E[g] / sqrt(E[g^2]) (Adam's drift per
  step in units of the learning rate) and the drift it predicts over the run's optimiser steps;
- the same with the gates forced to chosen values: a mean gradient of the opposite sign to the gate (positive
  for a positive gate) means that the loss pushes the gate back to 0, i.e. what the transformers add hurts;
- beside it, the gradient norms of the adapter's projection W and of the LM's parameters.

    python experiments/gate_gradients.py runs/demo/lm/ours/seed0 runs/demo/prepared --batches 60

A diagnosis on the training split, not a result of the test table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from planlm.data.windows import article_windows
from planlm.evaluate.loading import load_checked
from planlm.plans.config import PlanConfig, evaluation_plans
from planlm.plans.registry import plan_source

GATES = ("alpha_path", "alpha_sample")


def batches(split, batch_size: int, num_batches: int, seed: int) -> list[list[tuple[int, int, int]]]:
    """``num_batches`` batches of full-length training windows (context 128, stride 127), in a seeded order."""
    windows = [w for w in article_windows(split, 128, 127) if w[2] - w[1] == 128]
    order = np.random.default_rng(seed).permutation(len(windows))
    return [[windows[i] for i in order[b * batch_size:(b + 1) * batch_size]] for b in range(num_batches)]


def batch_loss(model, source, split, rows) -> torch.Tensor:
    """Mean next-token NLL of one batch of windows, its plan vectors computed with gradients."""
    positions = torch.stack([torch.arange(start, end) for _, start, end in rows])  # (B, L+1)
    tokens = torch.from_numpy(np.asarray(split.input_ids))[positions]
    plan_sentence = torch.from_numpy(np.asarray(split.token_plan_sentence))[positions[:, :-1]]  # (B, L)
    sentences, index = torch.unique(plan_sentence, return_inverse=True)
    vectors = model.plan_vectors(*source(sentences.numpy()))  # (S, D)
    nll = model.token_nll(tokens[:, :-1], tokens[:, 1:], plan_embeds=vectors[index])  # (B, L)
    return nll.mean()


def gradients(model, source, split, rows_list, gate_values) -> dict[str, np.ndarray]:
    """Per batch: each gate's gradient, and the gradient norms of the adapter's W and of the LM."""
    adapter = model.adapter
    for gate, value in zip(GATES, gate_values):
        with torch.no_grad():
            getattr(adapter, gate).fill_(value)
    lm_params = [p for n, p in model.named_parameters() if not n.startswith("adapter.")]
    out = {g: [] for g in (*GATES, "adapter_W_norm", "lm_norm")}
    for rows in rows_list:
        model.zero_grad(set_to_none=True)
        batch_loss(model, source, split, rows).backward()
        for gate in GATES:
            out[gate].append(float(getattr(adapter, gate).grad))
        out["adapter_W_norm"].append(float(adapter.projection.weight.grad.norm()))
        out["lm_norm"].append(float(torch.sqrt(sum((p.grad ** 2).sum() for p in lm_params if p.grad is not None))))
    return {k: np.asarray(v) for k, v in out.items()}


def drift_row(label: str, values: tuple[float, float], grads: dict[str, np.ndarray], lr: float, steps: int) -> str:
    cells = []
    for gate in GATES:
        g = grads[gate]
        ratio = g.mean() / np.sqrt((g ** 2).mean())
        cells.append(f"{g.mean():+.2e} | {g.std():.2e} | {ratio:+.3f} | {-lr * steps * ratio:+.3f}")
    return f"| {label} | {values[0]:+.3f} / {values[1]:+.3f} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("prepared_dir")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--values", type=float, nargs="+", default=[0.0, 0.03, 0.1])
    args = parser.parse_args()
    torch.manual_seed(0)
    prepared, split, model = load_checked(args.model_dir, args.prepared_dir, args.split)
    plans = evaluation_plans(PlanConfig(), model, args.model_dir)
    source = plan_source(plans, prepared, split)
    manifest = json.loads((Path(args.model_dir) / "manifest.json").read_text())
    train = manifest["config"]["train"]
    lr = (train.get("adapter_lr") or train["lr"]) * train["multipath_lr_scale"]  # the gated transformers' group
    steps = int(manifest["global_step"])
    trained = tuple(float(getattr(model.adapter, g).detach()) for g in GATES)
    rows_list = batches(split, args.batch_size, args.batches, seed=0)
    print(f"{args.model_dir}: trained alpha_1 {trained[0]:+.4f}, alpha_2 {trained[1]:+.4f}; {args.batches} batches of "
          f"{args.batch_size} {args.split} windows; gate lr {lr:g}, about {steps} optimiser steps in training\n")
    print("| gates | alpha_1 / alpha_2 | alpha_1: mean grad | spread | E[g]/rms (Adam drift per step / lr) | "
          "predicted drift over training | alpha_2: mean grad | spread | E[g]/rms | predicted drift |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    norms = None
    settings = [("trained", trained)] + [(f"forced {v:g}", (v, v)) for v in args.values]
    for label, values in settings:
        grads = gradients(model, source, split, rows_list, values)
        print(drift_row(label, values, grads, lr, steps), flush=True)
        norms = norms or grads
    print(f"\nAt the trained gates, the mean gradient norm of the LM is {norms['lm_norm'].mean():.3f} and of the "
          f"adapter's W {norms['adapter_W_norm'].mean():.3f}; the predicted drift is the gate's "
          f"change over training under Adam; a mean gradient of the gate's own sign pushes it back to 0.")


if __name__ == "__main__":
    main()
