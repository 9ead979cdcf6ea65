"""Wall time of each training and evaluation stage, run through the library's own commands (Lightning).

A synthetic prepared corpus with Wikipedia-like sentences (18-34 words, about 30 GPT-2 tokens) and
articles of 12-20 sentences stands in for a prepared corpus, so no sentence encoder or k-means runs
(``bench_prepare.py`` times those). The stages:

1. ``train_planner`` at the given width, T = 10, batch 512 (the paper's), for ``--planner_epochs``;
2. ``sample_plans``: K = 10 paths for every boundary of every split;
3. ``train_lm``: the LM (GPT-2 small shape with random weights: the same compute as the paper's
   pretrained GPT-2, whose weights are not on these machines) with the multipath adapter at K = T = 10,
   one epoch, batch 32 x 128, bf16-mixed on CUDA;
4. ``evaluate``: perplexity with the planner's K = 10 sampled plans, non-overlapping windows and the
   stride-1 reference protocol on a part of the test split.

It prints seconds and throughput per stage, and from them an estimate of one epoch of each stage on
the paper's corpus (``--paper_articles`` articles of ``--paper_sentences`` sentences on average).

    python benchmarks/bench_stages.py --device cuda --lm gpt2 --planner paper      # a GPU
    python benchmarks/bench_stages.py --articles 200                             # a CPU smoke run

With ``--stage_vs_loop`` it measures instead what the Lightning stage costs beyond its steps: ``train_lm``
(one epoch, the demo's LM, batch 16 x 128, oracle plans through Project-and-Avg, so the validation has its
plan-usage pass) timed whole, from the call to the manifest (loading, validation, checkpoints, saving
counted), against a bare PyTorch loop over the same training batches (the same loader, model, optimiser,
precision, loss and gradient clipping). The target of the training-speed issue: stage >= 0.85x the loop's
tokens/s.

    python benchmarks/bench_stages.py --stage_vs_loop --articles 150 --device cpu [--stage_lm near_zero]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from bench_lm import bf16_peak, mfu  # the GPUs' bf16 peaks and MFU, as bench_lm reports them
from planlm.args import LMRuntime, Runtime
from planlm.plans.config import PlanConfig

LMS = {"tiny": dict(n_layer=2, n_embd=128, n_head=2), "gpt2": dict(n_layer=12, n_embd=768, n_head=12)}
PLANNERS = {"tiny": dict(d_model=64, num_heads=2, dim_feedforward=128),
            "paper": dict(d_model=768, num_heads=2, dim_feedforward=2048)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--lm", choices=sorted(LMS), default="tiny")
    parser.add_argument("--planner", choices=sorted(PLANNERS), default="tiny")
    parser.add_argument("--dynamics", choices=["recurrent", "causal"], default="recurrent")
    parser.add_argument("--articles", type=int, default=2000, help="training articles")
    parser.add_argument("--planner_epochs", type=int, default=2)
    parser.add_argument("--eval_articles", type=int, default=20, help="test articles for stride-1 perplexity")
    parser.add_argument("--paper_articles", type=int, default=285_310)
    parser.add_argument("--paper_sentences", type=float, default=35.0, help="sentences per article (estimate)")
    parser.add_argument("--stage_vs_loop", action="store_true", help="the train_lm stage against a bare loop")
    parser.add_argument("--precision", default=None, help="--stage_vs_loop: precision (auto, native, fp32, bf16)")
    parser.add_argument("--loss_chunk_size", type=int, default=None, help="--stage_vs_loop: runtime.loss_chunk_size")
    parser.add_argument("--stage_lm", choices=sorted(STAGE_LMS), default="demo",
                        help="--stage_vs_loop: the demo's LM, a near-zero-compute one that exposes per-step "
                             "overhead, or GPT-2 small's shape (a GPU)")
    parser.add_argument("--batch_size", type=int, default=None, help="--stage_vs_loop: windows per batch (16)")
    parser.add_argument("--compile", action="store_true", help="--stage_vs_loop: runtime.compile (torch.compile)")
    parser.add_argument("--num_workers", type=int, default=0, help="--stage_vs_loop: train.num_workers")
    args = parser.parse_args()
    if args.stage_vs_loop:
        with tempfile.TemporaryDirectory() as tmp:
            stage_vs_loop(Path(tmp), args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_stages(Path(tmp), args)
    print_table(rows, args)


def run_stages(root: Path, args) -> list[tuple[str, float, float, str]]:
    """Rows (stage, seconds, units processed, unit)."""
    from planlm.data.artifacts import PreparedDataset
    from planlm.evaluate.perplexity import evaluate
    from planlm.models.adapter import AdapterSettings
    from planlm.models.planner import PlannerSettings
    from planlm.plans.sampling import sample_plans
    from planlm.testing.synthetic import make_synthetic_prepared
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm
    from planlm.train.planner import PlannerTrainArgs, train_planner

    runtime = Runtime(device=args.device)
    counts = {"train": args.articles, "validation": max(20, args.articles // 50), "test": max(40, args.eval_articles)}
    prepared_dir = make_synthetic_prepared(root / "prepared", num_actions=16, embedding_dim=384, rule="skip",
                                           num_articles=counts, min_sentences=12, max_sentences=20,
                                           sentence_words=(18, 34))
    prepared = PreparedDataset(prepared_dir)
    boundaries = prepared["train"].num_sentences
    tokens = len(prepared["train"].input_ids)
    rows = []

    began = time.perf_counter()
    planner = train_planner(str(prepared_dir), str(root / "planner"),
                            PlannerSettings(horizon=10, dynamics=args.dynamics, **PLANNERS[args.planner]),
                            PlannerTrainArgs(max_epochs=args.planner_epochs), runtime)
    rows.append(("train_planner (per epoch)", (time.perf_counter() - began) / args.planner_epochs, boundaries,
                 "boundaries"))

    began = time.perf_counter()
    plans = sample_plans(str(prepared_dir), PlanConfig(planner_dir=str(planner), num_paths=10, horizon=10),
                         runtime=runtime, out_dir=str(root / "plans"))
    all_boundaries = sum(prepared[s].num_sentences for s in ("train", "validation", "test"))
    rows.append(("sample_plans K=10 T=10 (all splits)", time.perf_counter() - began, all_boundaries, "boundaries"))

    began = time.perf_counter()
    lm = train_lm(str(prepared_dir), str(root / "lm"),
                  LMModelConfig(model_config={"model_type": "gpt2", "n_positions": 128, **LMS[args.lm]}),
                  PlanConfig(kind="planner_sampled", num_paths=10, horizon=10, plans_dir=str(plans)),
                  AdapterSettings(kind="multipath", num_heads=2),
                  LMTrainConfig(batch_size=32, max_epochs=1), LMRuntime(device=args.device))
    rows.append(("train_lm multipath K=T=10 (one epoch)", time.perf_counter() - began, tokens, "tokens"))

    for stride, articles, name in ((127, None, "evaluate, windows of 128 (test)"),
                                   (1, args.eval_articles, f"evaluate, stride 1 ({args.eval_articles} articles)")):
        began = time.perf_counter()
        metrics = evaluate(str(lm), str(prepared_dir), str(root / f"eval{stride}"), stride=stride,
                           max_articles=articles, runtime=runtime, plans=PlanConfig(plans_dir=str(plans)))
        rows.append((name, time.perf_counter() - began, metrics.tokens, "tokens"))
    return rows


# --stage_vs_loop's LMs: the demo's, one whose steps cost almost nothing, so that what the stage adds per step
# (logging, host syncs, collation) is not hidden behind the model's compute, and GPT-2 small's shape (a GPU).
STAGE_LMS = {"demo": {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 2, "n_positions": 128},
             "near_zero": {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 1, "n_positions": 128},
             "gpt2_small": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024}}


class PhaseTimer(L.pytorch.callbacks.Callback):
    """Wall seconds of the training steps, of validation and of the plan-usage pass (the second validation loader,
    plans shuffled), each between the hooks around its batches (CUDA synchronised)."""

    PHASES = ("train steps", "validation", "plan usage (shuffled plans)")

    def __init__(self):
        self.seconds = dict.fromkeys(self.PHASES, 0.0)
        self._began = 0.0

    def _start(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._began = time.perf_counter()

    def _stop(self, phase: str) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds[phase] += time.perf_counter() - self._began

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._start()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._stop("train steps")

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self._start()

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self._stop(self.PHASES[1] if dataloader_idx == 0 else self.PHASES[2])


@contextlib.contextmanager
def trainer_callback(callback):
    """Within the block, every trainer that train-lm builds also runs ``callback`` (a Lightning callback that times
    the stage from the inside)."""
    import planlm.train.lm as lm_stage

    build = lm_stage.build_trainer

    def with_callback(*args, **kwargs):
        trainer, best = build(*args, **kwargs)
        trainer.callbacks.append(callback)
        return trainer, best

    lm_stage.build_trainer = with_callback
    try:
        yield
    finally:
        lm_stage.build_trainer = build


def stage_vs_loop(root: Path, args) -> None:
    """Tokens/s of one train_lm epoch, timed whole and by phase, against a bare loop over the same batches."""
    from planlm.models.adapter import AdapterSettings
    from planlm.stage import read_manifest
    from planlm.testing.synthetic import make_synthetic_prepared
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    counts = {"train": args.articles, "validation": max(10, args.articles // 20), "test": 10}
    prepared_dir = make_synthetic_prepared(root / "prepared", num_actions=16, embedding_dim=384, rule="skip",
                                           num_articles=counts, min_sentences=12, max_sentences=20,
                                           sentence_words=(18, 34))
    lm_config = STAGE_LMS[args.stage_lm]
    chunk = {} if args.loss_chunk_size is None else {"loss_chunk_size": args.loss_chunk_size}
    runtime = LMRuntime(device=args.device, precision=args.precision or "auto", compile=args.compile, **chunk)
    batch_size = args.batch_size or 16
    kwargs = dict(model=LMModelConfig(model_config=lm_config), plans=PlanConfig(kind="oracle", num_paths=1, horizon=1),
                  adapter=AdapterSettings(kind="project_avg"), runtime=runtime,
                  train=LMTrainConfig(batch_size=batch_size, lr=1e-3, max_epochs=1, warmup_steps=5,
                                      log_every_n_steps=10, num_workers=args.num_workers))
    loop_s, tokens, params = bare_loop(prepared_dir, kwargs)  # first, after untimed warm-up steps
    timer = PhaseTimer()
    with trainer_callback(timer):
        began = time.perf_counter()
        out = train_lm(str(prepared_dir), str(root / "lm"), **kwargs)
        stage_s = time.perf_counter() - began
    fit_s = read_manifest(out)["train_wall_time_s"]
    device = runtime.training_device_type()
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    peak = bf16_peak(torch.device(device)) if runtime.arithmetic(device) == "bf16" else None
    print(f"train_lm, one epoch of {tokens:,} training tokens ({args.stage_lm} LM, {params / 1e6:.1f}M parameters, "
          f"batch {batch_size} x 128, oracle plans through Project-and-Avg, {name}, precision "
          f"{runtime.arithmetic(device)}, compile {runtime.compile}, loss chunk {runtime.loss_chunk_size}, "
          f"loader workers {args.num_workers}; under load if the machine is shared)")
    print(f"| {'run':<48} | {'seconds':>8} | {'tokens/s':>9} | vs loop | {'MFU':>6} |")
    print(f"|{'-' * 50}|{'-' * 10}|{'-' * 11}|---------|--------|")
    rows = [("bare loop (train steps only)", loop_s, True),
            ("stage: its train steps (hooks around each)", timer.seconds["train steps"], True),
            ("stage: fit (steps, validation, checkpoints)", fit_s, True),
            ("stage: whole call (+ loading, saving, manifest)", stage_s, True),
            ("  of which validation", timer.seconds["validation"], False),
            ("  of which plan usage (shuffled plans)", timer.seconds["plan usage (shuffled plans)"], False)]
    for what, seconds, rated in rows:
        if not rated:
            print(f"| {what:<48} | {seconds:>8.1f} | {'':>9} | {'':>7} | {'':>6} |")
            continue
        rate = tokens / seconds
        print(f"| {what:<48} | {seconds:>8.1f} | {rate:>9,.0f} | {loop_s / seconds:>6.2f}x | {mfu(params, rate, peak)} |")


def bare_loop(prepared_dir: Path, kwargs: dict, warmup_steps: int = 3) -> tuple[float, int, int]:
    """(seconds, training tokens, parameters) of a plain PyTorch loop over train_lm's own training batches, timed
    after ``warmup_steps`` untimed steps: its loader, model, optimiser and scheduler, device, precision,
    compilation, chunked loss, gradient clipping and malloc setting; nothing else."""
    from planlm.data.artifacts import PreparedDataset
    from planlm.data.resources import load_tokenizer
    from planlm.speed import keep_freed_memory, speed_up_lm
    from planlm.train.lm import _build_model, _loaders
    from planlm.train.lm_module import LightningLM

    train, plans, runtime = kwargs["train"], kwargs["plans"].resolve(), kwargs["runtime"]
    prepared = PreparedDataset(prepared_dir)
    tokenizer = load_tokenizer(prepared.tokenizer_name)
    planned = _build_model(prepared, kwargs["model"], plans, kwargs["adapter"], tokenizer, None, "train", train.seed)
    device = torch.device(runtime.training_device_type())
    planned.to(device)
    keep_freed_memory()  # as train_lm does (process-wide): a step's large buffers are not mapped afresh each time
    speed_up_lm(planned, runtime, "bare loop")
    train_loader, _ = _loaders(prepared, plans, train, tokenizer.pad_token_id or 0)
    module = LightningLM(planned, lr=train.lr, warmup_steps=train.warmup_steps)
    optimizers = module.configure_optimizers()
    optimizer, scheduler = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    bf16 = runtime.arithmetic(device.type) == "bf16"

    def step(batch: dict) -> int:
        batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = module.model_step(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(planned.parameters(), train.gradient_clip_val)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return int(batch["input_ids"].numel())

    # warm-up steps, untimed: the device's libraries, the allocator and (compile) the graph, which the stage,
    # running second, finds ready
    for _, batch in zip(range(warmup_steps), train_loader):
        step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    tokens = 0
    began = time.perf_counter()
    for batch in train_loader:
        tokens += step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began, tokens, sum(p.numel() for p in planned.lm.parameters())


def print_table(rows, args) -> None:
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else "CPU"
    print(f"device {device}; LM {args.lm}, planner {args.planner} ({args.dynamics}); {args.articles} training "
          f"articles")
    print(f"| {'stage':<40} | {'seconds':>8} | {'units':>10} | {'units/s':>10} | unit |")
    print(f"|{'-' * 42}|{'-' * 10}|{'-' * 12}|{'-' * 12}|------|")
    for name, seconds, units, unit in rows:
        print(f"| {name:<40} | {seconds:>8.1f} | {units:>10,.0f} | {units / seconds:>10,.0f} | {unit} |")
    rates = {name: units / seconds for name, seconds, units, _ in rows}
    paper_boundaries = args.paper_articles * args.paper_sentences
    paper_tokens = paper_boundaries * 30
    estimate = {"train_planner, one epoch": paper_boundaries / rates[rows[0][0]],
                "sample_plans K=10, train split": paper_boundaries / rates[rows[1][0]],
                "train_lm, one epoch": paper_tokens / rates[rows[2][0]]}
    print(f"\nestimate for {args.paper_articles:,} articles x {args.paper_sentences:g} sentences x 30 tokens "
          f"(the paper's corpus), from the rates above:")
    print(json.dumps({k: f"{v / 3600:.2f} h" for k, v in estimate.items()}, indent=1))


if __name__ == "__main__":
    main()
