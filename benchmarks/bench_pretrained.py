"""Training throughput on a real pretrained base: SmolLM2-135M (real weights from its GGUF file),
fp32 against bf16 autocast, and the three finetuning modes (frozen base + adapter, LoRA + adapter, full).

One run, the same batches for every variant (B windows of L real-vocabulary token ids, one
Project-and-Avg plan per ~25-token sentence), steps of the variants interleaved so that drifting load
on a shared machine hits them alike. A step is what ``train-lm`` runs: forward, backward, AdamW on the
trainable parameters. Process CPU time (all threads) is printed next to wall time: on a shared CPU it
is the steadier of the two. Ratios are against frozen fp32 (the predecessor's default).

    python benchmarks/bench_pretrained.py                   # SmolLM2-135M, batch 8 x 128, CPU
    python benchmarks/bench_pretrained.py --model tiny.gguf  # any GGUF file or HF name
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from planlm.models.adapter import AdapterConfig
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig, load_causal_lm
from planlm.plans.config import PlanConfig
from planlm.pretrained import SMOLLM2

FINETUNES = ("frozen", "lora", "full")
PRECISIONS = ("fp32", "bf16")


def make_batch(vocab_size: int, args, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random token ids; windows cut into sentences of ``sentence_tokens`` tokens, one plan (K=1, T=1) each."""
    input_ids = torch.randint(0, vocab_size, (args.batch_size, args.context_length), generator=gen)  # (B, L)
    per_window = -(-args.context_length // args.sentence_tokens)
    local = torch.arange(args.context_length) // args.sentence_tokens  # (L,)
    plan_index = local[None, :] + per_window * torch.arange(args.batch_size)[:, None]  # (B, L)
    num_sentences = per_window * args.batch_size
    return {"input_ids": input_ids, "labels": input_ids.clone(), "plan_index": plan_index,
            "action_paths": torch.randint(0, args.num_actions, (num_sentences, 1, 1), generator=gen)}  # (N, K, T)


def build(lm, finetune: str, args) -> tuple[PlannedLM, torch.optim.Optimizer]:
    """A planned LM (oracle-style Project-and-Avg adapter) over a copy of ``lm``, finetuned as asked."""
    torch.manual_seed(0)
    adapter = AdapterConfig(kind="project_avg", num_actions=args.num_actions, action_dim=args.action_dim,
                            hidden_size=lm.get_input_embeddings().embedding_dim)
    config = PlannedLMConfig(plans=PlanConfig(kind="oracle"), adapter=adapter, num_actions=args.num_actions)
    model = PlannedLM(config, lm if finetune == "frozen" else copy.deepcopy(lm)).train()
    model.adapter.projection.reset_parameters()  # W and b at PyTorch's init, not zero: plans that move
    model.apply_finetune(finetune, lora_rank=args.lora_rank)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(trainable, lr=1e-5)


def train_step(model: PlannedLM, optimizer, batch: dict, precision: str) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(models: dict, batches: list, args) -> tuple[dict, dict]:
    """Wall and CPU seconds of ``args.steps`` steps per (finetune, precision), after ``args.warmup``."""
    variants = [(f, p) for f in models for p in PRECISIONS]
    wall, cpu = dict.fromkeys(variants, 0.0), dict.fromkeys(variants, 0.0)
    for step in range(args.warmup + args.steps):
        for finetune, precision in variants:  # interleaved
            model, optimizer = models[finetune]
            start, start_cpu = time.perf_counter(), time.process_time()
            train_step(model, optimizer, batches[step % len(batches)], precision)
            if step >= args.warmup:
                wall[finetune, precision] += time.perf_counter() - start
                cpu[finetune, precision] += time.process_time() - start_cpu
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=SMOLLM2, help="GGUF file, HF folder or hub name (default: offline SmolLM2)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--sentence-tokens", type=int, default=25, help="tokens per sentence (Wikipedia: ~25)")
    parser.add_argument("--num-actions", type=int, default=1024)
    parser.add_argument("--action-dim", type=int, default=384, help="codebook width (MiniLM 384)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    start = time.perf_counter()
    lm = load_causal_lm(args.model)
    load_s = time.perf_counter() - start
    models = {finetune: build(lm, finetune, args) for finetune in FINETUNES}
    gen = torch.Generator().manual_seed(0)
    vocab_size = lm.get_input_embeddings().num_embeddings
    batches = [make_batch(vocab_size, args, gen) for _ in range(2)]
    wall, cpu = timed(models, batches, args)

    tokens = args.batch_size * args.context_length * args.steps
    params = sum(p.numel() for p in lm.parameters())
    print(f"{args.model}: {params / 1e6:.1f}M parameters, vocab {vocab_size}, loaded in {load_s:.1f} s; batch "
          f"{args.batch_size} x {args.context_length} tokens; Project-and-Avg adapter over {args.num_actions} "
          f"actions; LoRA rank {args.lora_rank}; {args.steps} timed steps each (threads: {torch.get_num_threads()})")
    print(f"| {'finetune':<8} | {'precision':<9} | {'trainable':>11} | {'s/step':>7} | {'tokens/s':>8} | "
          f"{'vs frozen fp32':>14} | {'tokens/CPU-s':>12} | {'vs frozen fp32':>14} |")
    print(f"|{'-' * 10}|{'-' * 11}|{'-' * 13}|{'-' * 9}|{'-' * 10}|{'-' * 16}|{'-' * 14}|{'-' * 16}|")
    base = ("frozen", "fp32")
    for finetune, precision in wall:
        trainable = sum(p.numel() for p in models[finetune][0].parameters() if p.requires_grad)
        key = (finetune, precision)
        print(f"| {finetune:<8} | {precision:<9} | {trainable:>11,} | {wall[key] / args.steps:>7.2f} | "
              f"{tokens / wall[key]:>8,.0f} | {wall[base] / wall[key]:>13.2f}x | {tokens / cpu[key]:>12,.0f} | "
              f"{cpu[base] / cpu[key]:>13.2f}x |")


if __name__ == "__main__":
    main()
