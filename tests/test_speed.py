"""train-lm's speed knobs (planlm.args.LMRuntime, applied by planlm.speed): torch.compile (its fallback to eager, the
state dict it leaves alone), the chunked loss (evaluation's too) and bf16 autocast through the commands, at tiny
size."""

from __future__ import annotations

import warnings

import pytest
import torch

from planlm.args import LMRuntime, Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.device import cpu_supports_bf16
from planlm.errors import PlanlmError
from planlm.evaluate.perplexity import evaluate
from planlm.models.planned_lm import PlannedLM
from planlm.plans.config import PlanConfig
from planlm.speed import compile_module, keep_freed_memory, speed_up_lm
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm
from planlm.train.lm_module import LightningLM

from helpers import tiny_gpt2_config, tiny_planned_lm

QUICK = dict(batch_size=4, max_epochs=1, limit_train_batches=2, limit_val_batches=1, lr=1e-3,
             log_every_n_steps=1, loggers=["csv"])
needs_bf16 = pytest.mark.skipif(not cpu_supports_bf16(), reason="this CPU has no native bf16")


@pytest.fixture
def failing_compile(monkeypatch):
    """torch.compile whose compiled function fails at its first call, as a compiler error does."""
    def compile_that_fails(fn, *args, **kwargs):
        def compiled(*a, **k):
            raise RuntimeError("InductorError: no C++ compiler\nmore lines")
        return compiled

    monkeypatch.setattr(torch, "compile", compile_that_fails)


def test_a_compiled_model_keeps_its_state_dict_keys_and_saves_and_loads_as_an_eager_one(synthetic_random, tmp_path):
    eager = tiny_planned_lm(PreparedDataset(synthetic_random), adapter="multipath")
    compiled = tiny_planned_lm(PreparedDataset(synthetic_random), adapter="multipath")
    speed_up_lm(compiled, LMRuntime(compile=True), "test")
    assert compiled.lm.transformer.forward is not eager.lm.transformer.forward.__func__  # compiled in place
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert list(LightningLM(compiled).state_dict()) == list(LightningLM(eager).state_dict())  # the checkpoints
    for name, model in (("eager", eager), ("compiled", compiled)):
        model.save_pretrained(tmp_path / name)
    reloaded = {name: PlannedLM.from_pretrained(tmp_path / name).state_dict() for name in ("eager", "compiled")}
    assert list(reloaded["compiled"]) == list(reloaded["eager"])
    for key, value in reloaded["eager"].items():
        torch.testing.assert_close(reloaded["compiled"][key], value, rtol=0, atol=0)


def test_a_failing_compile_warns_in_one_line_and_runs_eager(failing_compile):
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    inputs = torch.randn(2, 4)
    expected = module(inputs)
    compile_module(module, "train-lm: the LM")
    with pytest.warns(UserWarning) as caught:
        out = module(inputs)
    message = str(caught[0].message)
    assert message == ("train-lm: the LM: torch.compile failed (RuntimeError: InductorError: no C++ compiler); "
                       "running eager")
    torch.testing.assert_close(out, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eager from now on: no second warning
        torch.testing.assert_close(module(inputs), expected)


def test_a_failing_compile_of_the_loss_warns_once_and_runs_eager(failing_compile, monkeypatch):
    from planlm.models import lm_loss

    monkeypatch.setattr(lm_loss, "_KERNEL", {})
    torch.manual_seed(0)
    hidden, weight = torch.randn(20, 8, requires_grad=True), torch.randn(30, 8, requires_grad=True)
    targets = torch.randint(0, 30, (20,))
    expected = lm_loss.linear_cross_entropy(hidden, weight, targets, 8)
    with pytest.warns(UserWarning) as caught:
        got = lm_loss.linear_cross_entropy(hidden, weight, targets, 8, compiled=True)
    assert [str(w.message) for w in caught] == ["the chunked loss: torch.compile failed (RuntimeError: InductorError: "
                                                "no C++ compiler); running eager"]
    torch.testing.assert_close(got, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eager from now on: no second warning
        torch.testing.assert_close(lm_loss.linear_cross_entropy(hidden, weight, targets, 8, compiled=True), expected)


@needs_bf16
def test_train_lm_and_evaluate_in_bf16_with_the_chunked_loss(synthetic_random, tmp_path):
    """The fast setting through the commands: bf16 autocast and the chunked loss, and evaluation's chunked NLL equal
    to the plain one."""
    from planlm.evaluate.perplexity import evaluate_split
    from planlm.plans.config import evaluation_plans

    model_dir = train_lm(str(synthetic_random), str(tmp_path / "lm"), LMModelConfig(model_config=tiny_gpt2_config()),
                         PlanConfig(kind="oracle"), train=LMTrainConfig(**QUICK),
                         runtime=LMRuntime(precision="bf16", loss_chunk_size=64))
    assert PlannedLM.from_pretrained(model_dir).loss_chunk_size == 0  # a run setting, not saved
    metrics = evaluate(str(model_dir), str(synthetic_random), str(tmp_path / "eval"), max_articles=3, stride=64,
                       bootstrap_samples=10, runtime=Runtime(device="cpu", precision="fp32"))
    prepared = PreparedDataset(synthetic_random)
    model = PlannedLM.from_pretrained(model_dir)
    plans = evaluation_plans(PlanConfig(), model, str(model_dir))
    nll = {}
    for chunk in (0, 50):
        model.loss_chunk_size = chunk
        result = evaluate_split(model, prepared, prepared.split("test"), plans, 3, 64, 128, 32, torch.device("cpu"),
                                "fp32", False)
        nll[chunk] = result["nll_sums"].sum() / result["tokens"].sum()
    assert nll[50] == pytest.approx(nll[0], rel=1e-6)
    assert metrics.nll == pytest.approx(nll[0], rel=1e-6)


def test_malloc_keeps_freed_memory_on_glibc():
    import platform

    assert keep_freed_memory() == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_a_negative_chunk_size_is_a_one_line_error():
    with pytest.raises(PlanlmError, match="loss_chunk_size must be >= 0"):
        LMRuntime(loss_chunk_size=-1)


@pytest.mark.slow
def test_train_lm_compiled_for_real(synthetic_random, tmp_path):
    """torch.compile of the LM, the adapter and the loss kernel through train-lm (a minute or more on 2 cores:
    inductor builds C++); the compiled loss kernel equals the eager chunk step."""
    from planlm.models import lm_loss

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model_dir = train_lm(str(synthetic_random), str(tmp_path / "lm"),
                             LMModelConfig(model_config=tiny_gpt2_config()), PlanConfig(kind="oracle"),
                             train=LMTrainConfig(**QUICK), runtime=LMRuntime(compile=True, compile_loss=True))
        torch.manual_seed(0)
        hidden, weight = torch.randn(50, 8, requires_grad=True), torch.randn(40, 8, requires_grad=True)
        targets = torch.randint(0, 40, (50,))
        losses = [lm_loss.linear_cross_entropy(hidden, weight, targets, 16, compiled=c) for c in (False, True)]
        grads = [torch.autograd.grad(loss, (hidden, weight)) for loss in losses]
    assert not [w for w in caught if "torch.compile failed" in str(w.message)]  # no fallback to eager
    assert "softmax_grad" in lm_loss._KERNEL  # the compiled kernel ran (and, above, never fell back to eager)
    torch.testing.assert_close(losses[1], losses[0])
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert PlannedLM.from_pretrained(model_dir).adapter is not None
