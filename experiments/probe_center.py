"""Why a centered Fixed plan cost perplexity on long documents, and what fixes it.

A Fixed adapter (one action for every sentence) with centered plans is trained against a random upstream
gradient (what the LM sends back) and then evaluated. Centering c after W (c - mean c) makes the output 0 in
training, but W still gets a rounding-level gradient, and Adam scales any gradient to a step of about the
rate: W drifts at random. Training never sees the drift (the batch mean cancels it); evaluation does, since
the running mean lags it. Centering e before W (W (e - mean e), what ``adapter.center`` does for Project and
Avg) gives W exactly no gradient, so it stays at its no-op zero.

    python experiments/probe_center.py     # a few seconds
"""

from __future__ import annotations

import torch

from planlm.models.adapter import AdapterConfig, build_adapter, centered


def drift(where: str, optimizer: str, precision: str, steps: int = 300, momentum: float = 0.1) -> str:
    """One row: |W|, |c| and the evaluation shift |c - running mean| after ``steps`` steps."""
    torch.manual_seed(0)
    config = AdapterConfig(kind="project_avg", action_dim=384, num_actions=64, hidden_size=384, horizon=1,
                           center=where == "before W")
    adapter = build_adapter(config, torch.randn(64, 384) * 0.05)
    running_mean = torch.zeros(384)  # centering after W keeps its own running mean of c
    make = torch.optim.AdamW if optimizer == "AdamW" else torch.optim.SGD
    opt = make(adapter.parameters(), lr=1e-3)
    paths = torch.zeros(300, 1, 1, dtype=torch.long)  # Fixed: 300 sentences, one action
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            plans = adapter.train()(paths)
            if where == "after W":
                plans = centered(plans, running_mean, training=True, momentum=momentum)
            loss = (plans.float() * torch.randn(plans.shape)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        plan = adapter.eval()(paths[:1])
        if where == "after W":
            plan = centered(plan, running_mean, training=False)
    return (f"| {where} | {optimizer} | {precision} | {momentum} | {adapter.projection.weight.norm():.3f} "
            f"| {plan.norm():.4f} |")


def main() -> None:
    torch.set_num_threads(1)
    print("| centering | optimizer | precision | momentum | |W| after 300 steps | evaluation |c - mean| |")
    print("|---|---|---|---|---|---|")
    for row in [("after W", "AdamW", "fp32", 0.1), ("after W", "AdamW", "bf16", 0.1), ("after W", "SGD", "fp32", 0.1),
                ("after W", "SGD", "bf16", 0.1), ("after W", "AdamW", "fp32", 1.0), ("before W", "AdamW", "fp32", 0.1),
                ("before W", "AdamW", "bf16", 0.1)]:
        print(drift(*row[:3], momentum=row[3]))
    print("(A GPT-2-style token embedding row of width 384 has norm about 0.4.)")


if __name__ == "__main__":
    main()
