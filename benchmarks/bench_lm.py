"""Training throughput of the plan-conditioned LM against the same LM without conditioning.

One run measures, on the same batches (B windows of L tokens, ~S sentences per window, so N = B * S
unique plans per batch), the tokens per second of a full training step (forward, backward, AdamW)
of: the bare LM (the baseline), Project-and-Avg and the multi-path adapter at K paths x T steps.
Steps of the variants are interleaved so that drifting machine load hits all of them alike; on a
shared CPU the process CPU time (all threads) is reported next to wall time, as it is far less
sensitive to other jobs on the machine.
The target of the issue: multipath at T = 10, K = 10 keeps >= 0.85x of the baseline's tokens/s.

With ``--speed`` it measures instead the speed settings on the bare LM (the demo's shape by default: batch
16 x 128): fp32 eager with the foreach AdamW (the library before the speed work) against bf16 autocast, the
chunked loss (``planlm.models.lm_loss``), the fused AdamW, their combinations, the compiled loss kernel
(``LMRuntime.compile_loss``), and all of them with torch.compile of the transformer (``planlm.speed``), interleaved
step by step in one process; the target of the training-speed
issue is >= 2x fp32 eager's tokens/s. malloc's setting (``--keep-freed-memory``) is process-wide: compare two runs.

    python benchmarks/bench_lm.py                  # GPT-2 architecture, 2 layers x 128, CPU
    python benchmarks/bench_lm.py --gpt2-small     # the paper's GPT-2 small shape (use a GPU)
    python benchmarks/bench_lm.py --speed --batch-size 16 --steps 8    # the speed settings, demo shape
"""

from __future__ import annotations

import argparse
import time

import torch

from planlm.args import LMRuntime
from planlm.models.adapter import AdapterConfig
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig, load_causal_lm
from planlm.plans.config import PlanConfig
from planlm.speed import keep_freed_memory, speed_up_lm

GPT2_VOCAB = 50257
# Dense bf16 peak (FLOP/s) by a substring of the GPU's name: the SXM H100 and H200, the A100.
BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def make_batch(batch_size: int, context_length: int, sentence_tokens: int, num_paths: int, horizon: int,
               num_actions: int, gen: torch.Generator, vocab_size: int = GPT2_VOCAB) -> dict[str, torch.Tensor]:
    """Random tokens; windows cut into sentences of ``sentence_tokens`` tokens, one plan per sentence."""
    input_ids = torch.randint(0, vocab_size, (batch_size, context_length), generator=gen)  # (B, L)
    per_window = -(-context_length // sentence_tokens)
    local = torch.arange(context_length) // sentence_tokens  # (L,)
    plan_index = local[None, :] + per_window * torch.arange(batch_size)[:, None]  # (B, L)
    num_sentences = per_window * batch_size
    return {"input_ids": input_ids, "labels": input_ids.clone(), "attention_mask": torch.ones_like(input_ids),
            "plan_index": plan_index,
            "action_paths": torch.randint(0, num_actions, (num_sentences, num_paths, horizon), generator=gen),
            "path_mask": torch.ones(num_sentences, num_paths, horizon, dtype=torch.bool)}


def build(kind: str, lm_config: dict, args, device: torch.device,
          fused: bool = False) -> tuple[PlannedLM, torch.optim.Optimizer]:
    torch.manual_seed(0)
    lm = load_causal_lm(None, lm_config, vocab_size=args.vocab_size)
    width = lm.get_input_embeddings().embedding_dim
    if kind == "none":
        config = PlannedLMConfig()
    else:
        adapter = AdapterConfig(kind=kind, num_actions=args.num_actions, action_dim=args.action_dim,
                                hidden_size=width, horizon=args.horizon, num_heads=args.num_heads)
        config = PlannedLMConfig(plans=PlanConfig(kind="planner_sampled", num_paths=args.num_paths,
                                                  horizon=args.horizon), adapter=adapter, num_actions=args.num_actions)
    model = PlannedLM(config, lm).to(device).train()
    if model.adapter is not None:
        model.adapter.projection.reset_parameters()  # W and b at PyTorch's init, not zero: plans that move
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)


def train_step(model: PlannedLM, optimizer, batch: dict, conditioned: bool, device: torch.device,
               bf16: bool | None = None, cuda_graphs: bool = False) -> None:
    """One training step; bf16 autocast on CUDA unless ``bf16`` says otherwise."""
    batch = {name: t.to(device, non_blocking=True) for name, t in batch.items()}
    if cuda_graphs:
        torch.compiler.cudagraph_mark_step_begin()
    if not conditioned:
        for name in ("plan_index", "action_paths", "path_mask"):
            batch.pop(name)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" if bf16 is None else bf16):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpt2-small", action="store_true", help="GPT-2 small shape (12 x 768) instead of 2 x 128")
    parser.add_argument("--batch-size", type=int, default=None, help="windows per batch (default 8 CPU, 32 GPU)")
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--sentence-tokens", type=int, default=25, help="tokens per sentence (Wikipedia: ~25)")
    parser.add_argument("--num-paths", type=int, default=10)
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--num-actions", type=int, default=1024)
    parser.add_argument("--action-dim", type=int, default=384, help="codebook width (MiniLM 384, MPNet 768)")
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab-size", type=int, default=GPT2_VOCAB, help="the LM's vocabulary (GPT-2: 50,257)")
    parser.add_argument("--speed", action="store_true", help="the speed settings on the bare LM instead of the adapters")
    parser.add_argument("--loss-chunk-size", type=int, default=LMRuntime().loss_chunk_size)
    parser.add_argument("--no-compile", action="store_true", help="--speed without the torch.compile variant")
    parser.add_argument("--compile", nargs="?", const="true", default=None, choices=["true", "cudagraphs"],
                        help="torch.compile every variant's transformer and adapter (LMRuntime.compile); cudagraphs: "
                             "with CUDA graphs on CUDA")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="glibc malloc keeps freed memory (planlm.speed.keep_freed_memory; process-wide: compare two runs)")
    args = parser.parse_args()
    if args.keep_freed_memory:
        print(f"malloc keeps freed memory: {keep_freed_memory()}")
    device = torch.device(args.device)
    batch_size = args.batch_size or (32 if device.type == "cuda" else 8)
    if args.gpt2_small:
        lm_config = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024}
    else:
        lm_config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 2, "n_positions": 128}

    gen = torch.Generator().manual_seed(0)
    batches = [make_batch(batch_size, args.context_length, args.sentence_tokens, args.num_paths, args.horizon,
                          args.num_actions, gen, args.vocab_size) for _ in range(4)]
    if args.speed:
        speed_table(lm_config, args, device, batches, batch_size)
        return
    variants = ["none", "project_avg", "multipath"]
    models = {kind: build(kind, lm_config, args, device) for kind in variants}
    compile_value = {"true": True, "cudagraphs": "cudagraphs"}.get(args.compile, False)
    if compile_value:
        for kind, (model, _) in models.items():
            speed_up_lm(model, LMRuntime(device=device.type, compile=compile_value,
                                         loss_chunk_size=model.loss_chunk_size), f"bench_lm {kind}")
    graphs = compile_value == "cudagraphs" and device.type == "cuda"
    elapsed, cpu_time = time_interleaved(args, device, batches, variants, lambda kind, batch: train_step(
        *models[kind], batch, kind != "none", device, cuda_graphs=graphs))

    tokens = batch_size * args.context_length * args.steps
    num_plans = batches[0]["action_paths"].shape[0]
    shape = f"{lm_config['n_layer']} layers x {lm_config['n_embd']}"
    print(f"GPT-2 architecture {shape}, vocab {args.vocab_size}; device {device}; batch {batch_size} x "
          f"{args.context_length} tokens; {num_plans} plans/batch of K={args.num_paths} paths x T={args.horizon}; "
          f"{args.steps} timed steps each (threads: {torch.get_num_threads()}); compile {args.compile}")
    peak = bf16_peak(device)
    lm_params = sum(p.numel() for p in models["none"][0].lm.parameters())
    print(f"| {'variant':<12} | {'conditioning params':>19} | {'s/step':>7} | {'tokens/s':>9} | {'vs none':>7} "
          f"| {'CPU s/step':>10} | {'tokens/CPU-s':>12} | {'vs none':>7} | {'MFU':>6} |")
    print(f"|{'-' * 14}|{'-' * 21}|{'-' * 9}|{'-' * 11}|{'-' * 9}|{'-' * 12}|{'-' * 14}|{'-' * 9}|{'-' * 8}|")
    for kind in variants:
        model = models[kind][0]
        params = sum(p.numel() for p in model.adapter.parameters()) if model.adapter is not None else 0
        rate, cpu_rate = tokens / elapsed[kind], tokens / cpu_time[kind]
        print(f"| {kind:<12} | {params:>19,} | {elapsed[kind] / args.steps:>7.3f} | {rate:>9,.0f} | "
              f"{elapsed['none'] / elapsed[kind]:>6.2f}x | {cpu_time[kind] / args.steps:>10.3f} | {cpu_rate:>12,.0f} | "
              f"{cpu_time['none'] / cpu_time[kind]:>6.2f}x | {mfu(lm_params, rate, peak)} |")


def bf16_peak(device: torch.device) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s, for the ones named in BF16_PEAK; None elsewhere."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in BF16_PEAK.items() if key in name), None)


def mfu(params: int, tokens_per_s: float, peak: float | None) -> str:
    """Model FLOPs utilisation, 6 x parameters x tokens/s over the peak (attention's FLOPs left out)."""
    return f"{6 * params * tokens_per_s / peak:>6.1%}" if peak else f"{'-':>6}"


def time_interleaved(args, device: torch.device, batches: list[dict], names, step) -> tuple[dict, dict]:
    """Wall and CPU seconds of ``step(name, batch)`` per name over ``args.steps`` timed steps after
    ``args.warmup``, the names interleaved step by step so that drifting load hits every variant alike."""
    elapsed, cpu_time = {name: 0.0 for name in names}, {name: 0.0 for name in names}
    for index in range(args.warmup + args.steps):
        for name in names:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, start_cpu = time.perf_counter(), time.process_time()
            step(name, batches[index % len(batches)])
            if device.type == "cuda":
                torch.cuda.synchronize()
            if index >= args.warmup:
                elapsed[name] += time.perf_counter() - start
                cpu_time[name] += time.process_time() - start_cpu
    return elapsed, cpu_time


def speed_table(lm_config: dict, args, device: torch.device, batches: list[dict], batch_size: int) -> None:
    """Tokens/s of the bare LM's training step under each speed setting, as ratios to fp32 eager."""
    from planlm.device import cpu_supports_bf16

    chunk = args.loss_chunk_size

    def speed(chunk_size: int, compile: bool = False, compile_loss: bool = False) -> LMRuntime:
        # malloc's setting is process-wide: not per variant (--keep-freed-memory)
        return LMRuntime(loss_chunk_size=chunk_size, compile=compile, compile_loss=compile_loss)

    # name -> (bf16 autocast, speed settings, fused AdamW); "fp32 eager" is the library before the speed work
    variants = {"fp32 eager": (False, speed(0), False), "bf16": (True, speed(0), False),
                "chunked loss": (False, speed(chunk), False), "fused AdamW": (False, speed(0), True),
                "bf16 + chunked": (True, speed(chunk), False), "bf16 + chunked + fused": (True, speed(chunk), True),
                "+ compiled loss": (True, speed(chunk, compile_loss=True), True),
                "all + compile": (True, speed(chunk, True, True), True)}
    if args.no_compile:
        variants.pop("+ compiled loss"), variants.pop("all + compile")
    if device.type == "cpu" and not cpu_supports_bf16():
        variants = {name: v for name, v in variants.items() if not v[0]}
        print("this CPU has no native bf16 (avx512_bf16 / amx_bf16): the bf16 variants are left out")
    models = {}
    for name, (_, settings, fused) in variants.items():
        model, optimizer = build("none", lm_config, args, device, fused)
        speed_up_lm(model, settings, f"bench_lm {name}")
        models[name] = model, optimizer
    elapsed, cpu_time = time_interleaved(args, device, batches, variants, lambda name, batch: train_step(
        *models[name], batch, False, device, bf16=variants[name][0]))
    tokens = batch_size * args.context_length * args.steps
    print(f"GPT-2 architecture {lm_config['n_layer']} layers x {lm_config['n_embd']}, vocab {args.vocab_size}; "
          f"device {device}; batch {batch_size} x {args.context_length}; loss chunk {chunk} tokens; {args.steps} "
          f"timed steps each after {args.warmup} warm-up (threads: {torch.get_num_threads()})")
    print(f"| {'setting':<25} | {'s/step':>7} | {'tokens/s':>9} | {'vs fp32':>7} | {'CPU s/step':>10} | {'vs fp32':>7} |")
    print(f"|{'-' * 27}|{'-' * 9}|{'-' * 11}|{'-' * 9}|{'-' * 12}|{'-' * 9}|")
    base, base_cpu = elapsed["fp32 eager"], cpu_time["fp32 eager"]
    for name in variants:
        print(f"| {name:<25} | {elapsed[name] / args.steps:>7.3f} | {tokens / elapsed[name]:>9,.0f} | "
              f"{base / elapsed[name]:>6.2f}x | {cpu_time[name] / args.steps:>10.3f} | "
              f"{base_cpu / cpu_time[name]:>6.2f}x |")


if __name__ == "__main__":
    main()
