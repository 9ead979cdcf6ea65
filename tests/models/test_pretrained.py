"""A pretrained base LM from a GGUF file (the offline SmolLM2 route), through a tiny Llama GGUF written here:
export once to safetensors, load, tokenize with its own tokenizer, train an adapter on it, and the
one-line errors for bad input (missing / unreadable GGUF, another tokenizer, a GGUF-quantised folder,
bf16 on a CPU without it)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from helpers import write_tiny_llama_gguf

from planlm.args import Runtime
from planlm.errors import PlanlmError
from planlm.models.planned_lm import PlannedLM, load_causal_lm
from planlm.plans.config import PlanConfig
from planlm.stage import read_manifest
from planlm.testing.synthetic import make_synthetic_prepared
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PLANLM_CACHE", str(tmp_path_factory.getbasetemp() / "planlm-cache"))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(path of a tiny Llama GGUF with the GPT-2 tokenizer, the HF model it holds)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    return path, write_tiny_llama_gguf(path)


def quick(**overrides) -> LMTrainConfig:
    base = dict(batch_size=4, max_epochs=1, limit_train_batches=2, limit_val_batches=1, lr=1e-3,
                log_every_n_steps=1)
    return LMTrainConfig(**{**base, **overrides})


def test_a_gguf_file_loads_as_the_model_it_holds_and_is_exported_once(tiny_gguf, monkeypatch):
    from planlm import pretrained

    path, written = tiny_gguf
    lm = load_causal_lm(str(path))
    folder = pretrained.resolve_pretrained(str(path))
    config = json.loads((pretrained.Path(folder) / "config.json").read_text())
    assert "quantization_config" not in config and (pretrained.Path(folder) / "model.safetensors").is_file()
    input_ids = torch.tensor([[15496, 995, 13, 383]])
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids).logits, written(input_ids).logits)  # q/k un-permuted right
    monkeypatch.setattr(pretrained, "export_gguf", lambda *a: pytest.fail("exported twice"))
    load_causal_lm(str(path))  # the second load reads the exported folder


def test_the_gguf_export_bar_goes_to_the_stage_log_not_the_console(tiny_gguf, tmp_path, capfd):
    import io

    from planlm import pretrained
    from planlm.console import library_output_to

    path, _ = tiny_gguf
    log = io.StringIO()
    with library_output_to(log):
        pretrained.export_gguf(path, tmp_path / "exported")
    assert "de-quantizing GGUF tensors" in log.getvalue()
    captured = capfd.readouterr()
    assert "GGUF" not in captured.err + captured.out


def test_an_adapter_trains_on_a_gguf_base_with_its_own_tokenizer(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    prepared = make_synthetic_prepared(tmp_path / "prepared", tokenizer=str(path),
                                       num_articles={"train": 24, "validation": 4, "test": 4})
    assert read_manifest(prepared)["tokenizer"] == str(path)
    for finetune in ("frozen", "lora"):
        out = train_lm(str(prepared), str(tmp_path / finetune), train=quick(),
                       model=LMModelConfig(name_or_path=str(path), finetune=finetune, lora_rank=2),
                       plans=PlanConfig(kind="oracle"))
        model = PlannedLM.from_pretrained(out)
        assert model.config.base_model == str(path) and np.isfinite(read_manifest(out)["val_loss"])
        assert model.adapter.projection.weight.abs().sum() > 0  # the adapter moved off its no-op start
    # `planlm generate` on it, offline, the plans beside the text
    from planlm.evaluate.generate import generate
    from planlm.evaluate.generator import SamplingConfig

    result = generate(str(tmp_path / "frozen"), str(prepared), article=0, boundary=1, runtime=Runtime(device="cpu"),
                      sampling=SamplingConfig(max_new_tokens=12))
    assert len(result["token_ids"]) == 12 and result["sentences"][0]["plan"]["action_paths"]


def one_line_error(call) -> str:
    with pytest.raises(PlanlmError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_missing_or_unreadable_gguf_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "nowhere.gguf"
    message = one_line_error(lambda: load_causal_lm(str(missing)))
    assert str(missing) in message and "not found" in message
    unknown = tmp_path / "strange.gguf"
    write_tiny_llama_gguf(unknown, architecture="nosucharch")
    message = one_line_error(lambda: load_causal_lm(str(unknown)))
    assert str(unknown) in message and "cannot load" in message


def test_a_corpus_of_another_tokenizer_is_refused_before_training(tiny_gguf, synthetic_random, tmp_path):
    other = tmp_path / "other-vocab.gguf"
    write_tiny_llama_gguf(other, other_vocab=True)
    message = one_line_error(lambda: train_lm(str(synthetic_random), str(tmp_path / "out"), train=quick(),
                                              model=LMModelConfig(name_or_path=str(other), finetune="frozen"),
                                              plans=PlanConfig(kind="oracle")))
    assert "manifest.json" in message and f"--tokenizer {other}" in message


def test_a_folder_with_a_gguf_quantization_config_is_refused_before_training(tiny_gguf, synthetic_random, tmp_path):
    from planlm.pretrained import resolve_pretrained

    folder = tmp_path / "quantised"
    shutil.copytree(resolve_pretrained(str(tiny_gguf[0])), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gguf"}}))
    message = one_line_error(lambda: train_lm(str(synthetic_random), str(tmp_path / "out"), train=quick(),
                                              model=LMModelConfig(name_or_path=str(folder))))
    assert str(folder / "config.json") in message and "quantization_config" in message
    assert not (tmp_path / "out" / "checkpoints").exists()  # nothing trained


def test_bf16_on_a_cpu_without_it_is_refused(synthetic_random, tmp_path, monkeypatch):
    from planlm import device
    from planlm.device import autocast

    monkeypatch.setattr(device, "cpu_supports_bf16", lambda: False)
    message = one_line_error(lambda: train_lm(str(synthetic_random), str(tmp_path / "out"), train=quick(),
                                              runtime=Runtime(device="cpu", precision="bf16")))
    assert "--runtime.precision bf16:" in message and "--runtime.precision fp32" in message
    message = one_line_error(lambda: autocast(torch.device("cpu"), "bf16"))
    assert "--precision bf16" in message and "fp32" in message


def test_bf16_mixed_trains_on_a_cpu_with_it(synthetic_random, tmp_path, monkeypatch):
    from planlm import device

    monkeypatch.setattr(device, "cpu_supports_bf16", lambda: True)  # emulated where the CPU lacks it: still correct
    out = train_lm(str(synthetic_random), str(tmp_path / "bf16"), train=quick(),
                   runtime=Runtime(device="cpu", precision="bf16"), plans=PlanConfig(kind="oracle"))
    assert np.isfinite(read_manifest(out)["val_loss"])


def test_none_on_a_frozen_pretrained_base_is_the_base_itself(tiny_gguf, synthetic_random, tmp_path):
    path, written = tiny_gguf
    out = train_lm(str(synthetic_random), str(tmp_path / "none"), train=quick(),
                   model=LMModelConfig(name_or_path=str(path), finetune="frozen"))
    manifest = read_manifest(out)
    assert manifest["global_step"] == 0 and manifest["trainable_parameters"] == 0 and np.isfinite(manifest["val_loss"])
    lm = PlannedLM.from_pretrained(out).lm
    for name, weight in written.state_dict().items():
        torch.testing.assert_close(lm.state_dict()[name], weight, rtol=0, atol=0)
