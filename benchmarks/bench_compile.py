"""The compiled LM stage (``runtime.compile``) against the eager one and against a bare compiled loop, in one run.

One synthetic corpus (``bench_stages.py``'s: Wikipedia-like sentences, 12-20 a article), oracle plans through the
adapter (multipath at K = T = 2 by default), one ``train_lm`` epoch per setting, each through the library's own
command, with a callback that times every training step and counts dynamo's graphs around it. A step that compiled
a graph is counted as compilation, not as a step; the others give the steady step time (median) and tokens/s. Then a
bare loop (no Lightning) over the same padded batches, with the same compiled model, gives the bare compiled step.
It prints: eager stage step, compiled stage step (and CUDA graphs on CUDA) with their ratio, compiled stage vs the
bare compiled step, the graphs each epoch compiled (training and validation), the buckets of sentences the batches
fell in, and each call's time outside its steps (``call_time_s`` in the manifest).

    python benchmarks/bench_compile.py --device cpu --articles 40          # the demo's LM (2 x 128), a CPU
    python benchmarks/bench_compile.py --device cpu --prepared_dir runs/demo/codebooks/seed0 --steps 20  # its data too
    python benchmarks/bench_compile.py --device cuda --stage_lm gpt2_small --articles 400 --batch_size 32
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from bench_stages import STAGE_LMS, trainer_callback
from planlm.args import LMRuntime
from planlm.plans.config import PlanConfig


class StepTimer(L.pytorch.callbacks.Callback):
    """Wall seconds of every training step and whether dynamo compiled a graph during it; graphs per phase."""

    def __init__(self):
        from torch._dynamo.utils import counters

        self.counters = counters
        self.steps: list[tuple[float, bool]] = []
        self.graphs: collections.Counter = collections.Counter()
        self._began, self._graphs = 0.0, 0

    def _count(self) -> int:
        return self.counters["stats"]["unique_graphs"]

    def _sync(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._sync()
        self._began, self._graphs = time.perf_counter(), self._count()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._sync()
        compiled = self._count() - self._graphs
        self.steps.append((time.perf_counter() - self._began, compiled > 0))
        self.graphs[f"train {trainer.current_epoch}"] += compiled

    def on_validation_start(self, trainer, module):
        self._graphs = self._count()

    def on_validation_end(self, trainer, module):
        self.graphs[f"validation {trainer.current_epoch}"] += self._count() - self._graphs


def run_stage(root: Path, prepared_dir: Path, kwargs: dict, runtime: LMRuntime, name: str) -> dict:
    """One train_lm call under ``runtime``: its steady step time, compiled steps, graphs and call times."""
    from planlm.stage import read_manifest
    from planlm.train.lm import train_lm

    torch._dynamo.reset()
    timer = StepTimer()
    with trainer_callback(timer):
        out = train_lm(str(prepared_dir), str(root / name), runtime=runtime, **kwargs)
    steady = [seconds for seconds, compiled in timer.steps if not compiled][1:]  # the first: the allocator's warm-up
    return {"step": statistics.median(steady) if steady else float("nan"), "steady_steps": len(steady),
            "compiling_steps": sum(compiled for _, compiled in timer.steps),
            "compiling_s": sum(seconds for seconds, compiled in timer.steps if compiled),
            "graphs": dict(timer.graphs), "call": read_manifest(out)["call_time_s"]}


def bare_compiled_step(prepared_dir: Path, kwargs: dict, runtime: LMRuntime, steps: int) -> float:
    """Median seconds of a bare training step (no Lightning: forward, backward, clipping, AdamW) of the compiled
    model over the stage's own padded batches, after every bucket's graph is compiled."""
    from planlm.data.artifacts import PreparedDataset
    from planlm.data.resources import load_tokenizer
    from planlm.speed import speed_up_lm
    from planlm.train.lm import _build_model, _loaders, step_shapes
    from planlm.train.lm_module import LightningLM

    torch._dynamo.reset()
    train, plans = kwargs["train"], kwargs["plans"].resolve()
    prepared = PreparedDataset(prepared_dir)
    tokenizer = load_tokenizer(prepared.tokenizer_name)
    planned = _build_model(prepared, kwargs["model"], plans, kwargs["adapter"], tokenizer, None, "train", train.seed)
    device = torch.device(runtime.training_device_type())
    planned.to(device)
    speed_up_lm(planned, runtime, "bare loop")
    module = LightningLM(planned, lr=train.lr, **step_shapes(train, runtime))
    optimizer = module.configure_optimizers()["optimizer"]
    bf16 = runtime.arithmetic(device.type) == "bf16"
    batches = list(_loaders(prepared, plans, train, tokenizer.pad_token_id or 0)[0])
    if train.limit_train_batches:  # the stage's own steps an epoch: the batches it saw
        batches = batches[:int(train.limit_train_batches)]

    def step(batch: dict) -> float:
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        if device.type == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = module.model_step(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(planned.parameters(), train.gradient_clip_val)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - began

    for batch in batches:  # every bucket compiled, untimed
        step(batch)
    return statistics.median(step(batches[i % len(batches)]) for i in range(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--stage_lm", choices=sorted(STAGE_LMS), default="demo")
    parser.add_argument("--articles", type=int, default=40, help="training articles")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--adapter", default="multipath", help="project_avg or multipath")
    parser.add_argument("--paths", type=int, default=2, help="K = T")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--bare_steps", type=int, default=8, help="timed steps of the bare compiled loop")
    parser.add_argument("--prepared_dir", default=None,
                        help="a run's codebook folder (runs/demo/codebooks/seed0: its sotu pieces, its BPE vocabulary "
                             "and that seed's actions) instead of the synthetic corpus")
    parser.add_argument("--steps", type=int, default=None, help="training steps per epoch (default: the whole split)")
    args = parser.parse_args()

    from planlm.models.adapter import AdapterSettings
    from planlm.testing.synthetic import make_synthetic_prepared
    from planlm.train.lm import LMModelConfig, LMTrainConfig

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.prepared_dir:
            prepared_dir = Path(args.prepared_dir)
        else:
            counts = {"train": args.articles, "validation": max(4, args.articles // 10), "test": 2}
            prepared_dir = make_synthetic_prepared(root / "prepared", num_actions=16, embedding_dim=384, rule="skip",
                                                   num_articles=counts, min_sentences=12, max_sentences=20,
                                                   sentence_words=(18, 34))
        kwargs = dict(model=LMModelConfig(model_config=STAGE_LMS[args.stage_lm]),
                      plans=PlanConfig(kind="oracle", num_paths=args.paths, horizon=args.paths),
                      adapter=AdapterSettings(kind=args.adapter),
                      train=LMTrainConfig(batch_size=args.batch_size, lr=1e-3, max_epochs=2, warmup_steps=2,
                                          log_every_n_steps=10, limit_train_batches=args.steps))
        settings = {"eager": False, "compiled": True}
        if LMRuntime(device=args.device).training_device_type() == "cuda":
            settings["CUDA graphs"] = "cudagraphs"
        results = {name: run_stage(root, prepared_dir, kwargs, LMRuntime(device=args.device, precision=args.precision,
                                                                           compile=value), name.replace(" ", "_"))
                   for name, value in settings.items()}
        compiled = LMRuntime(device=args.device, precision=args.precision, compile=True)
        bare = bare_compiled_step(prepared_dir, kwargs, compiled, args.bare_steps)

    tokens = args.batch_size * 128
    device = LMRuntime(device=args.device).training_device_type()
    corpus = args.prepared_dir or f"{args.articles} synthetic training articles"
    print(f"train_lm, two epochs, {args.stage_lm} LM, {args.adapter} at K = T = {args.paths}, oracle plans, batch "
          f"{args.batch_size} x 128 (padded), {corpus}, {args.steps or 'all'} steps an epoch, device {device}, precision "
          f"{args.precision}; steady steps: the median of the steps that compiled nothing; under load if the "
          f"machine is shared")
    print("| setting | steady step (s) | tokens/s | vs eager | steps compiling | their seconds | graphs (train 0 / "
          "validation 0 / train 1 / validation 1) | call outside steps |")
    print("|---|---|---|---|---|---|---|---|")
    for name, result in results.items():
        graphs = " / ".join(str(result["graphs"].get(key, 0)) for key in
                            ("train 0", "validation 0", "train 1", "validation 1"))
        call = result["call"]
        print(f"| {name} | {result['step']:.3f} | {tokens / result['step']:,.0f} | "
              f"{results['eager']['step'] / result['step']:.2f}x | {result['compiling_steps']} | "
              f"{result['compiling_s']:.1f} | {graphs} | {call['call'] - call['steps']:.1f} s of {call['call']:.1f} s "
              f"({call['outside_steps_share']:.0%}) |")
    print(f"| bare compiled loop | {bare:.3f} | {tokens / bare:,.0f} | {results['eager']['step'] / bare:.2f}x | | | | |")
    print(f"compiled stage vs bare compiled step: {bare / results['compiled']['step']:.2f}x")
    for name, result in results.items():
        call = result["call"]
        print(f"{name} call: " + ", ".join(f"{key} {value}" for key, value in call.items()))


if __name__ == "__main__":
    main()
