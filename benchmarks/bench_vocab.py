"""Training step time of the demo's LM with GPT-2's vocabulary against a smaller one (``prepare.tokenizer: bpe:V``).

One process, steps of the two vocabularies interleaved so that drifting machine load hits both alike; a full
step (forward, backward, AdamW) of a GPT-2-architecture LM on B windows of L random token ids. Prints the
median step time of each and their ratio; process CPU time beside wall time (less sensitive to other jobs).

    python benchmarks/bench_vocab.py                         # 2 layers x 128 (the demo), 50,257 vs 8,192
    python benchmarks/bench_vocab.py --vocab 50257 4096 --steps 20
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs=2, default=[50257, 8192], help="baseline and small vocabulary")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per vocabulary (after 2 warm-up steps)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    models = {v: GPT2LMHeadModel(GPT2Config(vocab_size=v, n_layer=args.layers, n_embd=args.width, n_head=2,
                                            n_positions=args.length, bos_token_id=0, eos_token_id=0))
              for v in args.vocab}
    optimisers = {v: torch.optim.AdamW(m.parameters(), lr=1e-3) for v, m in models.items()}
    wall = {v: [] for v in models}
    cpu = {v: [] for v in models}
    for step in range(args.steps + 2):
        for vocab, model in models.items():
            ids = torch.randint(0, vocab, (args.batch, args.length))  # (B, L)
            start, start_cpu = time.perf_counter(), time.process_time()
            loss = model(input_ids=ids, labels=ids).loss
            optimisers[vocab].zero_grad()
            loss.backward()
            optimisers[vocab].step()
            if step >= 2:
                wall[vocab].append(time.perf_counter() - start)
                cpu[vocab].append(time.process_time() - start_cpu)
    median = {v: (sorted(wall[v])[len(wall[v]) // 2], sorted(cpu[v])[len(cpu[v]) // 2]) for v in models}
    base, small = args.vocab
    for vocab, (w, c) in median.items():
        print(f"vocabulary {vocab:>6}: {w:.3f} s/step wall, {c:.3f} s CPU, "
              f"{args.batch * args.length / w:,.0f} tokens/s")
    print(f"step time ratio {base} / {small}: {median[base][0] / median[small][0]:.2f}x wall, "
          f"{median[base][1] / median[small][1]:.2f}x CPU")


if __name__ == "__main__":
    main()
