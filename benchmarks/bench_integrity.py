"""Cost of the file checks of ``planlm.stage.integrity`` on a run folder the size of the demo's.

Without a finished demo run at hand (``--run_dir``), it writes one of the same sizes with the library's own
writers, no training: a prepared corpus (``--train_sentences`` sentences of 384-d MiniLM embeddings and about
``--tokens_per_sentence`` GPT-2 tokens each, 64 actions), the demo's planner (d_model 128, T 5) and a plan cache
(K = T = 5), and for each of ``--conditions`` conditions a planned LM (the demo's 2-layer, 128-wide GPT-2: a
~27 MB model.safetensors, multipath adapter) and an evaluation folder. Every folder gets its manifest through
``write_manifest`` (which records the files).

For every stage it prints the bytes recorded and the seconds of: the record (at write time), the cheap check
that every reader runs on reuse (``check_files(full=False)``, its in-process memo cleared first) and the full
check of ``planlm verify``. The page cache is warm (the files were just written or read): on a cold disk add
the bytes read over the disk's throughput.

    python benchmarks/bench_integrity.py                         # a demo-sized folder, written to a temp dir
    python benchmarks/bench_integrity.py --run_dir runs/demo     # an existing run folder
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from planlm.stage import MANIFEST, integrity, write_manifest


def write_demo_sized_run(root: Path, train_sentences: int, tokens_per_sentence: int, conditions: int) -> None:
    import torch
    from safetensors.torch import save_file

    from planlm.data.artifacts import write_split
    from planlm.models.adapter import AdapterConfig
    from planlm.models.planned_lm import PlannedLM, PlannedLMConfig, load_causal_lm
    from planlm.models.planner import Planner, PlannerConfig
    from planlm.plans.config import PlanConfig

    rng = np.random.default_rng(0)
    num_actions, dim = 64, 384
    prepared = root / "prepared"
    sizes = {"train": train_sentences, "validation": train_sentences // 15, "test": train_sentences // 15}
    for split, sentences in sizes.items():
        articles = max(1, sentences // 40)
        tokens = sentences * tokens_per_sentence
        sentence_offsets = np.linspace(0, sentences, articles + 1).astype(np.int64)
        token_sentence = np.repeat(np.arange(sentences), tokens_per_sentence)
        arrays = {"sentence_offsets": sentence_offsets, "sentence_spans": rng.integers(0, 500, (sentences, 2)),
                  "embeddings": rng.standard_normal((sentences, dim), dtype=np.float32),
                  "actions": rng.integers(0, num_actions, sentences),
                  "token_offsets": sentence_offsets * tokens_per_sentence,
                  "input_ids": rng.integers(0, 50257, tokens), "token_sentence": token_sentence}
        texts = [{"id": str(a), "title": "", "text": "word " * 40 * tokens_per_sentence} for a in range(articles)]
        write_split(prepared / split, texts, arrays)
    save_file({"centroids": torch.randn(num_actions, dim)}, str(prepared / "codebook.safetensors"))
    write_manifest(prepared, {"demo_sized": True})

    planner = Planner(PlannerConfig(num_actions=num_actions, embedding_dim=dim, d_model=128, num_heads=2,
                                    num_layers=1, dim_feedforward=256, horizon=5))
    planner.save_pretrained(root / "planner")
    write_manifest(root / "planner", {"planner": True})
    cache = root / "planner" / "plans" / "K5-T5-tau1-seed0"
    cache.mkdir(parents=True)
    for split, sentences in sizes.items():
        np.save(cache / f"{split}.npy", rng.integers(0, num_actions, (sentences, 5, 5)))
        np.save(cache / f"{split}.argmax.npy", rng.integers(0, num_actions, (sentences, 5)))
        np.save(cache / f"{split}.num_paths.npy", np.full(sentences, 5))
    write_manifest(cache, {"plans": True})

    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 2, "n_positions": 128}
    adapter = AdapterConfig(kind="multipath", num_actions=num_actions, action_dim=dim, hidden_size=128, horizon=5)
    for index in range(conditions):
        config = PlannedLMConfig(plans=PlanConfig(kind="planner_sampled", num_paths=5, horizon=5), adapter=adapter,
                                 num_actions=num_actions, base_model_config=gpt2)
        model = PlannedLM(config, load_causal_lm(None, gpt2, vocab_size=50257), torch.randn(num_actions, dim))
        model.save_pretrained(root / "lm" / f"condition{index}")
        write_manifest(root / "lm" / f"condition{index}", {"lm": index})
        evaluation = root / "eval" / f"condition{index}"
        evaluation.mkdir(parents=True)
        (evaluation / "per_article.csv").write_text("article,id,nll_sum,tokens\n" + "0,a,1.0,10\n" * sizes["test"])
        np.save(evaluation / "num_paths.npy", np.full(sizes["test"], 5))
        (evaluation / "metrics.json").write_text('{"ppl": 30.0}\n')
        write_manifest(evaluation, {"eval": index})


def time_stages(run_dir: Path, repeats: int) -> None:
    from planlm.stage import read_manifest
    from planlm.stage.integrity import check_files

    print(f"{'stage folder':<34} {'files':>5} {'MB':>8} {'record s':>9} {'cheap s':>8} {'full s':>7} {'cheap MB hashed':>16}")
    for manifest_path in sorted(run_dir.rglob(MANIFEST)):
        stage = manifest_path.parent
        manifest = read_manifest(stage)
        files = manifest.get("files") or {}
        total = sum(f["size"] for f in files.values())
        started = time.perf_counter()
        integrity.record_files(stage)
        record = time.perf_counter() - started
        timings = {}
        for full in (False, True):
            best = float("inf")
            for _ in range(repeats):
                integrity._passed.clear()  # no memo: the cost of a first read in a process
                started = time.perf_counter()
                damage = check_files(stage, manifest, full=full)
                best = min(best, time.perf_counter() - started)
                assert not damage, damage
            timings[full] = best
        hashed = _cheap_hashed_bytes(files)
        print(f"{str(stage.relative_to(run_dir)):<34} {len(files):>5} {total / 1e6:>8.1f} {record:>9.3f} "
              f"{timings[False]:>8.3f} {timings[True]:>7.3f} {hashed / 1e6:>16.1f}")


def _cheap_hashed_bytes(files: dict) -> int:
    budget, hashed = integrity.QUICK_HASH_BYTES, 0
    for size in sorted(f["size"] for f in files.values()):
        if size <= budget:
            budget -= size
            hashed += size
    return hashed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run_dir", help="an existing run folder (default: write a demo-sized one)")
    parser.add_argument("--train_sentences", type=int, default=60000, help="about 1500 wiki articles of 40 sentences")
    parser.add_argument("--tokens_per_sentence", type=int, default=30)
    parser.add_argument("--conditions", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.run_dir:
        time_stages(Path(args.run_dir), args.repeats)
        return
    with tempfile.TemporaryDirectory(prefix="bench_integrity_") as tmp:
        started = time.perf_counter()
        write_demo_sized_run(Path(tmp), args.train_sentences, args.tokens_per_sentence, args.conditions)
        print(f"wrote a demo-sized run folder in {time.perf_counter() - started:.1f}s "
              f"(QUICK_HASH_BYTES = {integrity.QUICK_HASH_BYTES >> 20} MiB per stage)")
        time_stages(Path(tmp), args.repeats)


if __name__ == "__main__":
    main()
