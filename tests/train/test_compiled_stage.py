"""The compiled LM stage (``runtime.compile``): batches padded to static shapes (planlm.train.shapes), so that a
compiled epoch with varying sentence counts compiles at most one graph per bucket and validation compiles its own
once; the padding leaves the scored tokens' loss as it is; compiled losses equal eager ones within tolerance; and
without compilation nothing is padded."""

from __future__ import annotations

import collections

import pytest
import torch

from planlm.args import LMRuntime
from planlm.data.artifacts import PreparedDataset
from planlm.data.windows import WindowCollator, article_windows
from planlm.models.adapter import AdapterSettings
from planlm.plans.config import PlanConfig
from planlm.plans.registry import plan_source
from planlm.stage import read_manifest
from planlm.train import lm as lm_stage
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm
from planlm.train.lm_module import LightningLM
from planlm.train.shapes import StaticShapes, sentence_bucket

from helpers import tiny_gpt2_config, tiny_planned_lm

NO_DROPOUT = tiny_gpt2_config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def test_sentence_buckets_hold_their_counts_with_at_most_half_again_of_padding():
    assert [sentence_bucket(n) for n in (1, 8, 9, 12, 13, 17, 24, 25, 33, 100, 200)] == \
        [8, 8, 12, 12, 16, 24, 24, 32, 48, 128, 256]
    for n in range(1, 2000):
        assert n <= sentence_bucket(n) <= max(8, 1.5 * n)
    assert len({sentence_bucket(n) for n in range(100, 201)}) == 3  # a factor of two: three buckets


def _batches(prepared_dir, plans: PlanConfig, batch_size: int = 4) -> list[dict]:
    prepared = PreparedDataset(prepared_dir)
    split = prepared["train"]
    collate = WindowCollator(split, plan_source(plans.resolve(), prepared, split), 0)
    windows = article_windows(split, 128, 127)
    return [collate(windows[i:i + batch_size]) for i in range(0, len(windows), batch_size)]


@pytest.mark.parametrize("adapter", ["project_avg", "multipath"])
def test_padding_to_static_shapes_leaves_the_loss_and_gradients_of_the_scored_tokens(synthetic_random, adapter):
    model = tiny_planned_lm(PreparedDataset(synthetic_random), adapter=adapter)
    model.loss_chunk_size = 64
    if adapter == "multipath":
        with torch.no_grad():  # open the gates: the transformers over paths and samples count
            model.adapter.alpha_path.fill_(0.7)
            model.adapter.alpha_sample.fill_(0.5)
    batch = _batches(synthetic_random, PlanConfig(kind="oracle", num_paths=2, horizon=3))[-1]
    batch = {name: value[:3, :100] if name in ("input_ids", "attention_mask", "labels", "plan_index") else value
             for name, value in batch.items()}  # fewer windows and shorter ones than the static shape
    plain, static = LightningLM(model), LightningLM(model, static_shapes=StaticShapes(4, 128))
    padded = static.static_shapes.pad(batch)
    assert padded["input_ids"].shape == (4, 128) and len(padded["action_paths"]) == sentence_bucket(
        len(batch["action_paths"])) > len(batch["action_paths"])
    results = []
    for module, static_loss in ((plain, False), (static, True)):
        model.static_shapes = static_loss
        loss, tokens = module.model_step(batch)
        results.append((loss, tokens, *torch.autograd.grad(loss, list(model.parameters()))))
    assert results[0][1] == results[1][1] == (batch["labels"][:, 1:] != -100).sum()
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def _count_graphs(monkeypatch, backend: str) -> tuple[list, list]:
    """torch.compile with ``backend``; returns (phases: [(name, unique dynamo graphs at its start)], buckets: [(phase,
    the bucket of each batch's sentences)]), filled as train_lm runs (a callback marks the phases)."""
    import lightning as L
    from torch._dynamo.utils import counters

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **options: compile_(fn, **{**options, "backend": backend}))
    torch._dynamo.reset()
    counters.clear()
    phases, buckets = [], []
    pad = StaticShapes.pad

    def counting_pad(self, batch):
        buckets.append((phases[-1][0], sentence_bucket(len(batch["action_paths"]))))
        return pad(self, batch)

    monkeypatch.setattr(StaticShapes, "pad", counting_pad)

    class Phases(L.pytorch.callbacks.Callback):
        def on_train_epoch_start(self, trainer, module):
            phases.append((f"train {trainer.current_epoch}", counters["stats"]["unique_graphs"]))

        def on_validation_epoch_start(self, trainer, module):
            phases.append((f"validation {trainer.current_epoch}", counters["stats"]["unique_graphs"]))

        def on_validation_epoch_end(self, trainer, module):
            phases.append(("end", counters["stats"]["unique_graphs"]))

    build = lm_stage.build_trainer

    def counted(*args, **kwargs):
        trainer, best = build(*args, **kwargs)
        trainer.callbacks.append(Phases())
        return trainer, best

    monkeypatch.setattr(lm_stage, "build_trainer", counted)
    return phases, buckets


def test_a_compiled_epoch_with_varying_sentence_counts_compiles_one_graph_per_bucket(synthetic_random, tmp_path,
                                                                                       monkeypatch):
    """Two epochs with validation, the multipath adapter (K = 2, T = 2), batches of 17-32 sentences: the LM's
    transformer compiles one graph for training and one for validation, the adapter one per bucket of sentences in
    each; the second epoch compiles only for a bucket the first did not see, and its validation nothing."""
    phases, buckets = _count_graphs(monkeypatch, "eager")
    train_lm(str(synthetic_random), str(tmp_path / "lm"), LMModelConfig(model_config=NO_DROPOUT),
             PlanConfig(kind="oracle", num_paths=2, horizon=2), AdapterSettings(kind="multipath"),
             LMTrainConfig(batch_size=4, max_epochs=2, lr=1e-3, limit_train_batches=10, limit_val_batches=3),
             LMRuntime(compile=True))
    seen = collections.defaultdict(set)
    for phase, bucket in buckets:
        seen[phase].add(bucket)
    assert len(seen["train 0"]) >= 2  # the sentence counts vary across buckets
    names = [name for name, _ in phases]
    assert names == ["train 0", "validation 0", "end", "train 1", "validation 1", "end"]
    new = {name: after - before for (name, before), (_, after) in zip(phases, phases[1:]) if name != "end"}
    assert new["train 0"] <= 1 + len(seen["train 0"])  # the LM's transformer + the adapter per bucket
    assert new["validation 0"] <= 1 + len(seen["validation 0"])  # validation's own graphs (no dropout, no grad)
    assert new["train 1"] <= len(seen["train 1"] - seen["train 0"])  # only for a bucket not seen before
    assert new["validation 1"] == 0  # the same validation batches: the graphs of the first
    assert sum(new.values()) > 0  # it compiled


def test_compiled_losses_equal_eager_within_tolerance(synthetic_random, tmp_path, monkeypatch):
    """The same run eager and compiled (through AOT autograd, the compiler's autograd; the inductor kernels in the
    slow test below): validation loss within 1e-4 relative, and the eager run pads nothing."""
    pads = []
    pad = StaticShapes.pad
    monkeypatch.setattr(StaticShapes, "pad", lambda self, batch: pads.append(1) or pad(self, batch))
    kwargs = dict(model=LMModelConfig(model_config=NO_DROPOUT), plans=PlanConfig(kind="oracle", num_paths=2, horizon=2),
                  adapter=AdapterSettings(kind="multipath"),
                  train=LMTrainConfig(batch_size=4, max_epochs=1, limit_train_batches=6, limit_val_batches=3, lr=1e-3))
    eager = read_manifest(train_lm(str(synthetic_random), str(tmp_path / "eager"), **kwargs))["val_loss"]
    assert not pads
    _count_graphs(monkeypatch, "aot_eager")
    compiled = read_manifest(train_lm(str(synthetic_random), str(tmp_path / "compiled"), **kwargs,
                                      runtime=LMRuntime(compile=True)))["val_loss"]
    assert compiled == pytest.approx(eager, rel=1e-4)


@pytest.mark.slow
def test_inductor_compiled_losses_equal_eager_within_tolerance(synthetic_random, tmp_path):
    """The real compiler (inductor's C++ kernels; minutes on 2 cores)."""
    kwargs = dict(model=LMModelConfig(model_config=NO_DROPOUT), plans=PlanConfig(kind="oracle", num_paths=2, horizon=2),
                  adapter=AdapterSettings(kind="multipath"),
                  train=LMTrainConfig(batch_size=4, max_epochs=1, limit_train_batches=6, limit_val_batches=3, lr=1e-3))
    eager = read_manifest(train_lm(str(synthetic_random), str(tmp_path / "eager"), **kwargs))["val_loss"]
    compiled = read_manifest(train_lm(str(synthetic_random), str(tmp_path / "compiled"), **kwargs,
                                      runtime=LMRuntime(compile=True)))["val_loss"]
    assert compiled == pytest.approx(eager, rel=1e-4)


@pytest.mark.slow
def test_the_compiled_lm_draws_the_eager_lms_dropout_masks_on_the_cpu():
    """With the stage's compile options on the CPU, a compiled training forward of an LM with dropout equals the
    eager one from the same seed (inductor's own generator would draw other masks)."""
    from planlm.models.planned_lm import load_causal_lm
    from planlm.speed import compile_module, compile_options

    torch.manual_seed(0)
    lm = load_causal_lm(None, tiny_gpt2_config(n_layer=2), vocab_size=100).train()
    assert lm.config.resid_pdrop > 0 and lm.config.attn_pdrop > 0
    input_ids = torch.randint(0, 100, (2, 16))
    torch.manual_seed(1)
    eager = lm(input_ids).logits
    compile_module(lm.transformer, "test", **compile_options(LMRuntime(compile=True, device="cpu")))
    torch.manual_seed(1)
    compiled = lm(input_ids).logits
    torch.manual_seed(2)
    assert not torch.allclose(lm(input_ids).logits, compiled, atol=1e-3)  # dropout is on: another seed differs
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_compile_settings():
    assert LMRuntime(compile="cudagraphs").compile == "cudagraphs"
    from planlm.errors import PlanlmError

    with pytest.raises(PlanlmError, match="choose false, true or cudagraphs"):
        LMRuntime(compile="fast")
    from planlm.speed import compile_options

    cpu = {"dynamic": False, "options": {"fallback_random": True}}  # dropout drawn by PyTorch's generator
    assert compile_options(LMRuntime(compile=True, device="cpu")) == cpu
    assert compile_options(LMRuntime(compile="cudagraphs", device="cpu")) == cpu  # CUDA graphs: CUDA only
    steps = lm_stage.step_shapes(LMTrainConfig(batch_size=5, context_length=64, stride=32), LMRuntime(compile=True))
    assert steps == {"static_shapes": StaticShapes(5, 64), "cuda_graphs": False}
    assert lm_stage.step_shapes(LMTrainConfig(), LMRuntime()) == {"static_shapes": None, "cuda_graphs": False}
