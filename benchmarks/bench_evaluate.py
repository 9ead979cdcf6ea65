"""Benchmark of ``planlm evaluate``: cost of K and of the reference protocol, as ratios measured in one run.

1. Perplexity evaluation wall time (planner paths + adapter + LM) at K = 50 against K = 1, planner_sampled,
   T = 10, multipath adapter, for each planner dynamics (the paper's recurrent g and the cached causal g).
   Target: at most 1.25x (the paper's cost model, 1 h + 0.25 h per path, gives about 11x at K = 50).
2. Throughput (scored tokens/s) of the reference protocol (stride-1 windows of <= 128 tokens, conditioned
   on precomputed plans) against a bare batched forward pass of the same HF LM over the same windows
   (the same batches; the bare pass computes the logits of every position, as a plain ``lm(input_ids)``
   does) and against the same bare pass restricted to the scored positions. Target: >= 0.8x.

Data: a synthetic prepared corpus with long articles (so that stride 1 really slides) of sentences about as
long as Wikipedia's (the offline corpus: 28 GPT-2 tokens per sentence), GPT-2 tokenizer.

    python benchmarks/bench_evaluate.py                      # 6 x 384 GPT-2, 256-wide planner, on CPU
    python benchmarks/bench_evaluate.py --lm gpt2 --planner paper --device cuda --articles 64
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from planlm.plans.config import PlanConfig

LMS = {"tiny": dict(n_layer=2, n_embd=128, n_head=2), "small": dict(n_layer=6, n_embd=384, n_head=6),
       "gpt2": dict(n_layer=12, n_embd=768, n_head=12)}
PLANNERS = {"tiny": dict(d_model=64, num_heads=2, dim_feedforward=128),  # the planner of configs/demo.yaml's size
            "default": dict(d_model=256, num_heads=4, dim_feedforward=1024),  # PlannerSettings's defaults
            "paper": dict(d_model=768, num_heads=2, dim_feedforward=2048)}  # f and g 6.3M parameters each
NUM_ACTIONS = 16  # the synthetic vocabulary allows 16 actions of 3 words


def build(root: Path, lm_size: str, num_articles: int, planner_size: str, dynamics_kinds: list[str]):
    from transformers import GPT2Config, GPT2LMHeadModel

    from planlm.data.artifacts import PreparedDataset
    from planlm.models.adapter import AdapterConfig
    from planlm.models.planned_lm import PlannedLM, PlannedLMConfig
    from planlm.models.planner import Planner, PlannerConfig
    from planlm.plans.config import PlanConfig
    from planlm.testing.synthetic import make_synthetic_prepared

    prepared_dir = make_synthetic_prepared(root / "prepared", num_actions=NUM_ACTIONS, embedding_dim=32,
                                           rule="skip",
                                           num_articles={"train": 20, "validation": 2, "test": num_articles},
                                           min_sentences=12, max_sentences=20, sentence_words=(18, 34))
    prepared = PreparedDataset(prepared_dir)
    for dynamics in dynamics_kinds:
        torch.manual_seed(0)
        planner = Planner(PlannerConfig(num_actions=NUM_ACTIONS, embedding_dim=32, horizon=10, dynamics=dynamics,
                                        **PLANNERS[planner_size]), prepared.codebook)
        planner.save_pretrained(root / f"planner-{dynamics}")
    width = LMS[lm_size]["n_embd"]
    lm = GPT2LMHeadModel(GPT2Config(n_positions=128, vocab_size=50257, **LMS[lm_size]))
    adapter = AdapterConfig(kind="multipath", num_actions=NUM_ACTIONS, action_dim=32, hidden_size=width,
                            horizon=10, num_heads=2)
    config = PlannedLMConfig(plans=PlanConfig(kind="planner_sampled", num_paths=10, horizon=10), adapter=adapter,
                             num_actions=NUM_ACTIONS, codebook_hash=prepared.codebook_hash)
    model = PlannedLM(config, lm, prepared.codebook).eval()
    model.adapter.projection.reset_parameters()  # W and b at PyTorch's init, not zero: plans that move
    return prepared, model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def bare_forward(lm, split, windows, batch_size: int, device: torch.device, precision: str, keep_scored: bool) -> float:
    """The same windows and batches through the plain HF LM; returns seconds."""
    from planlm.device import autocast
    from planlm.evaluate.perplexity import window_batches

    input_ids_all = torch.from_numpy(np.array(split.input_ids)).to(device)
    batches = window_batches(windows, batch_size)
    sync(device)
    began = time.perf_counter()
    for rows in batches:
        start, first, end = windows[rows, 1], windows[rows, 2], windows[rows, 3]
        length = int(end[0] - 1 - start[0])
        positions = torch.from_numpy(start).to(device)[:, None] + torch.arange(length, device=device)
        with autocast(device, precision):
            lm(input_ids=input_ids_all[positions], logits_to_keep=int(end[0] - first[0]) if keep_scored else 0)
    sync(device)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", choices=sorted(LMS), default="small")
    parser.add_argument("--planner", choices=sorted(PLANNERS), default="default")
    parser.add_argument("--dynamics", nargs="+", choices=["recurrent", "causal"], default=["recurrent", "causal"])
    parser.add_argument("--articles", type=int, default=6)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats; the best of each is reported")
    args = parser.parse_args()

    from planlm.device import resolve_device
    from planlm.evaluate.perplexity import evaluate_split, scoring_windows

    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepared, model = build(root, args.lm, args.articles, args.planner, args.dynamics)
        split = prepared["test"]
        model = model.to(device)
        windows = scoring_windows(split.token_offsets, range(args.articles), 128, 1)
        scored = int((windows[:, 3] - windows[:, 2]).sum())

        def run(dynamics: str, num_paths: int, num_articles: int = args.articles) -> dict:
            cond = PlanConfig(kind="planner_sampled", num_paths=num_paths, horizon=10, planner_dir=str(root / f"planner-{dynamics}")).resolve()
            return evaluate_split(model, prepared, split, cond, num_articles, stride=1, batch_size=args.batch_size,
                                  device=device, precision=args.precision)

        run(args.dynamics[0], 1, num_articles=1)  # warm-up (allocator, kernels, lazy imports)
        # Interleaved repeats, best of each: a shared machine's load then hits every measurement alike.
        cases = [(dynamics, num_paths) for dynamics in args.dynamics for num_paths in (1, 50)]
        runs = {case: [] for case in cases} | {"full": [], "kept": []}
        for _ in range(args.repeats):
            for case in cases:
                runs[case].append(run(*case))
            for keep, name in ((False, "full"), (True, "kept")):
                runs[name].append(bare_forward(model.lm, split, windows, args.batch_size, device, args.precision,
                                               keep_scored=keep))
        results = {case: min(runs[case], key=lambda r: r["wall_time_s"]) for case in cases}
        bare_full, bare_kept = min(runs["full"]), min(runs["kept"])

    boundaries = int(split.sentence_offsets[args.articles])
    print(f"device {device}, LM {args.lm} ({sum(p.numel() for p in model.lm.parameters()) / 1e6:.1f}M), planner "
          f"{args.planner} ({PLANNERS[args.planner]}), {args.articles} articles, {boundaries} boundaries, "
          f"{len(windows)} windows, {scored} scored tokens, batch {args.batch_size}, planner_sampled T=10, multipath "
          f"adapter, best of {args.repeats}")
    print()
    print(f"{'measurement':<58} {'seconds':>8} {'ratio':>7} {'target':>8}")
    for dynamics in args.dynamics:
        one, fifty = results[(dynamics, 1)], results[(dynamics, 50)]
        print(f"{dynamics + ' g, evaluation K=1 (plans ' + format(one['plan_time_s'], '.2f') + ' s + LM)':<58} "
              f"{one['wall_time_s']:>8.2f} {1.0:>7.2f}")
        print(f"{dynamics + ' g, evaluation K=50 (plans ' + format(fifty['plan_time_s'], '.2f') + ' s + LM)':<58} "
              f"{fifty['wall_time_s']:>8.2f} {fifty['wall_time_s'] / one['wall_time_s']:>7.2f} {'<= 1.25':>8}")
    print(f"{'  paper cost model 1 h + 0.25 h K, K=50 vs K=1':<58} {'':>8} {(1 + 0.25 * 50) / 1.25:>7.2f}")
    one = results[(args.dynamics[0], 1)]
    lm_rate = scored / one["lm_time_s"]
    print(f"{'bare HF forward, same windows, all logits (tokens/s)':<58} {bare_full:>8.2f} "
          f"{1.0:>7.2f}   ({scored / bare_full:,.0f} tok/s)")
    print(f"{'reference protocol K=1, LM part (tokens/s) vs bare all logits':<58} {one['lm_time_s']:>8.2f} "
          f"{lm_rate / (scored / bare_full):>7.2f} {'>= 0.8':>8}   ({lm_rate:,.0f} tok/s)")
    print(f"{'reference protocol K=1, all included, vs bare all logits':<58} {one['wall_time_s']:>8.2f} "
          f"{bare_full / one['wall_time_s']:>7.2f} {'>= 0.8':>8}")
    print(f"{'bare HF forward, same windows, scored logits only':<58} {bare_kept:>8.2f} "
          f"{bare_full / bare_kept:>7.2f}   (speed vs all logits)")
    print(f"{'reference protocol K=1, LM part vs bare scored logits only':<58} {one['lm_time_s']:>8.2f} "
          f"{bare_kept / one['lm_time_s']:>7.2f} {'>= 0.8':>8}")


if __name__ == "__main__":
    main()
