"""Benchmark of ``planlm evaluate``: cost of K and of the reference protocol, as ratios measured in one run.

1. Perplexity evaluation wall time (planner paths + adapter + LM) at K = 50 against K = 1, planner_sampled,
   T = 10, multipath adapter. Target: at most 1.25x (the paper's cost model, 1 h + 0.25 h per path, gives
   about 11x at K = 50).
2. Throughput (scored tokens/s) of the reference protocol (stride-1 windows of <= 128 tokens, conditioned
   on precomputed plans) against a bare batched forward pass of the same HF LM over the same windows
   (the same batches; the bare pass computes the logits of every position, as a plain ``lm(input_ids)``
   does) and against the same bare pass restricted to the scored positions. Target: >= 0.8x.

Data: a synthetic prepared corpus with long articles (so that stride 1 really slides), GPT-2 tokenizer.

    python benchmarks/bench_evaluate.py                      # tiny GPT-2 (2 x 128) on CPU
    python benchmarks/bench_evaluate.py --lm gpt2 --device cuda --articles 64
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

LMS = {"tiny": dict(n_layer=2, n_embd=128, n_head=2), "small": dict(n_layer=6, n_embd=384, n_head=6),
       "gpt2": dict(n_layer=12, n_embd=768, n_head=12)}


def build(root: Path, lm_size: str, num_articles: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    from planlm.adapter import AdapterConfig
    from planlm.data.artifacts import PreparedDataset
    from planlm.data.synthetic import make_synthetic_prepared
    from planlm.lm import PlannedLM, PlannedLMConfig
    from planlm.planner import Planner, PlannerConfig

    prepared_dir = make_synthetic_prepared(root / "prepared", num_actions=16, embedding_dim=32, rule="skip",
                                           num_articles={"train": 20, "validation": 2, "test": num_articles},
                                           min_sentences=25, max_sentences=40, sentence_words=(5, 9))
    prepared = PreparedDataset(prepared_dir)
    torch.manual_seed(0)
    planner = Planner(PlannerConfig(num_actions=16, embedding_dim=32, d_model=64, num_heads=2, dim_feedforward=128,
                                    horizon=10), prepared.codebook)
    planner.save_pretrained(root / "planner")
    width = LMS[lm_size]["n_embd"]
    lm = GPT2LMHeadModel(GPT2Config(n_positions=128, vocab_size=50257, **LMS[lm_size]))
    adapter = AdapterConfig(adapter="multipath", num_actions=16, action_dim=32, hidden_size=width, horizon=10,
                            num_heads=2, init_no_op=False)
    config = PlannedLMConfig(conditioning="planner_sampled", adapter=adapter, num_paths=10, horizon=10,
                             num_actions=16, codebook_hash=prepared.codebook_hash, planner_dir=str(root / "planner"))
    return prepared, PlannedLM(config, lm, prepared.codebook).eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def bare_forward(lm, split, windows, batch_size: int, device: torch.device, precision: str, keep_scored: bool) -> float:
    """The same windows and batches through the plain HF LM; returns seconds."""
    from planlm.evaluate.perplexity import autocast, window_batches

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
    parser.add_argument("--lm", choices=sorted(LMS), default="tiny")
    parser.add_argument("--articles", type=int, default=12)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats; the best of each is reported")
    args = parser.parse_args()

    from planlm.evaluate.perplexity import EvalConditioning, evaluate_split, resolve_device, scoring_windows

    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepared, model = build(root, args.lm, args.articles)
        split = prepared["test"]
        model = model.to(device)
        windows = scoring_windows(split.token_offsets, range(args.articles), 128, 1)
        scored = int((windows[:, 3] - windows[:, 2]).sum())

        def run(num_paths: int, num_articles: int = args.articles) -> dict:
            cond = EvalConditioning("planner_sampled", num_paths, 10, 1.0, 0, 0, str(root / "planner"), None)
            return evaluate_split(model, prepared, split, cond, num_articles, stride=1, batch_size=args.batch_size,
                                  device=device, precision=args.precision)

        run(1, num_articles=1)  # warm-up (allocator, kernels, lazy imports)
        # Interleaved repeats, best of each: a shared machine's load then hits every measurement alike.
        runs = {1: [], 50: [], "full": [], "kept": []}
        for _ in range(args.repeats):
            for num_paths in (1, 50):
                runs[num_paths].append(run(num_paths))
            for keep, name in ((False, "full"), (True, "kept")):
                runs[name].append(bare_forward(model.lm, split, windows, args.batch_size, device, args.precision,
                                               keep_scored=keep))
        results = {num_paths: min(runs[num_paths], key=lambda r: r["wall_time_s"]) for num_paths in (1, 50)}
        bare_full, bare_kept = min(runs["full"]), min(runs["kept"])

    one, fifty = results[1], results[50]
    print(f"device {device}, LM {args.lm} ({sum(p.numel() for p in model.lm.parameters()) / 1e6:.1f}M), "
          f"{args.articles} articles, {len(windows)} windows, {scored} scored tokens, batch {args.batch_size}, "
          f"planner_sampled T=10, multipath adapter, best of {args.repeats}")
    print()
    print(f"{'measurement':<58} {'seconds':>8} {'ratio':>7} {'target':>8}")
    print(f"{'evaluation K=1 (plans ' + format(one['plan_time_s'], '.2f') + ' s + LM)':<58} "
          f"{one['wall_time_s']:>8.2f} {1.0:>7.2f}")
    print(f"{'evaluation K=50 (plans ' + format(fifty['plan_time_s'], '.2f') + ' s + LM)':<58} "
          f"{fifty['wall_time_s']:>8.2f} {fifty['wall_time_s'] / one['wall_time_s']:>7.2f} {'<= 1.25':>8}")
    print(f"{'  paper cost model 1 h + 0.25 h K, K=50 vs K=1':<58} {'':>8} {(1 + 0.25 * 50) / 1.25:>7.2f}")
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
