"""`planlm train-lm` end to end on tiny models: every adapter and action source, learning, resume,
finetuning modes, bad input and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from planlm.cli import main as cli_main
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.jsonio import write_json
from planlm.models.adapter import AdapterSettings
from planlm.models.planned_lm import PlannedLM
from planlm.plans.config import PlanConfig, trained_plans
from planlm.stage import read_manifest, write_manifest
from planlm.stage.integrity import record_files
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

from helpers import read_csv, tiny_gpt2_config, tiny_planner

TINY = tiny_gpt2_config()


def quick(**overrides) -> LMTrainConfig:
    """One epoch of two optimiser steps, then validation on one batch."""
    base = dict(batch_size=4, max_epochs=1, limit_train_batches=2, limit_val_batches=1, lr=1e-3, log_every_n_steps=1)
    return LMTrainConfig(**{**base, **overrides})


def write_plan_cache(folder: Path, prepared_dir: Path, num_paths: int, horizon: int,
                     codebook_hash: str | None = None) -> Path:
    """A plan cache in the documented format (random paths), as `planlm sample-plans` writes it."""
    prepared = PreparedDataset(prepared_dir)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split in ("train", "validation"):
        num_sentences = prepared[split].num_sentences
        np.save(folder / f"{split}.npy", rng.integers(0, prepared.num_actions, (num_sentences, num_paths, horizon)))
        np.save(folder / f"{split}.argmax.npy", rng.integers(0, prepared.num_actions, (num_sentences, horizon)))
    write_manifest(folder, {"test": True}, num_paths=num_paths, horizon=horizon, temperature=1.0, seed=0,
                   planner_hash="feedbeef", planner_dir="/somewhere/planner",
                   codebook_hash=codebook_hash or prepared.codebook_hash, num_actions=prepared.num_actions,
                   prepared_dir=str(prepared_dir), splits=["train", "validation"])
    return folder


def val_loss(folder: Path) -> float:
    return read_manifest(folder)["val_loss"]


def rescored_val_loss(model_dir: Path, prepared_dir: Path, num_windows: int, context_length: int = 128,
                      stride: int = 127) -> float:
    """The mean token NLL of the saved model on the first validation windows, outside Lightning: one window
    at a time, plans gathered per token from ``token_plan_sentence``, log-softmax by hand."""
    from planlm.data.windows import article_windows
    from planlm.plans.registry import plan_source

    model = PlannedLM.from_pretrained(model_dir).eval()
    prepared = PreparedDataset(prepared_dir)
    split = prepared["validation"]
    source = plan_source(trained_plans(model), prepared, split)
    total, count = 0.0, 0
    for _, start, end in article_windows(split, context_length, stride)[:num_windows]:
        input_ids = torch.from_numpy(np.array(split.input_ids[start:end]))[None]  # (1, L)
        kwargs = {}
        if source is not None:
            sentences, plan_index = np.unique(np.array(split.token_plan_sentence[start:end]), return_inverse=True)
            action_paths, path_mask, _ = source(sentences)
            kwargs = dict(action_paths=action_paths, path_mask=path_mask,
                          plan_index=torch.from_numpy(plan_index)[None])
        with torch.no_grad():
            logits = model(input_ids, **kwargs).logits[0, :-1].double()  # (L-1, V)
        log_probs = logits - torch.logsumexp(logits, -1, keepdim=True)
        total -= float(log_probs.gather(1, input_ids[0, 1:, None]).sum())
        count += end - start - 1
    return total / count


@pytest.mark.slow
def test_oracle_plans_beat_the_fixed_action_on_plan_determined_wording_long(synthetic_random, tmp_path):
    """The converged version of the learning test below (3 epochs).

    Once converged, a model without the plan still infers a sentence's action from its first word, so
    only the first word of each sentence stays harder: about log(8) = 2.1 nats over ~6 tokens per
    sentence, i.e. a gap of ~0.35 nats per token (measured: 0.32)."""
    losses = {}
    for kind in ("oracle", "fixed"):
        out = train_lm(str(synthetic_random), str(tmp_path / kind), model=LMModelConfig(model_config=TINY),
                       plans=PlanConfig(kind=kind, num_paths=2, horizon=2), adapter=AdapterSettings(kind="multipath"),
                       train=LMTrainConfig(batch_size=8, lr=1e-2, max_epochs=3))
        losses[kind] = val_loss(out)
    assert losses["oracle"] < losses["fixed"] - 0.2, losses


def test_oracle_plans_beat_the_fixed_action_on_plan_determined_wording(synthetic_random, tmp_path):
    """synthetic_random: each sentence's words are drawn from its action's words and actions are random,
    so only a model that reads the plan can tell which words come next."""
    losses = {}
    for kind in ("oracle", "fixed"):
        out = train_lm(str(synthetic_random), str(tmp_path / kind), model=LMModelConfig(model_config=TINY),
                       plans=PlanConfig(kind=kind),
                       train=LMTrainConfig(batch_size=4, lr=3e-2, limit_train_batches=40, max_epochs=1))
        losses[kind] = val_loss(out)
    assert losses["oracle"] < losses["fixed"] - 0.7, losses


@pytest.mark.parametrize("conditioning,adapter,rezero,num_paths,horizon", [
    ("none", "project_avg", True, 1, 1),
    ("fixed", "project_avg", True, 1, 1),
    ("oracle", "multipath", True, 3, 2),
    ("planner_argmax", "project_avg", True, 1, 2),
    ("planner_sampled", "multipath", False, 3, 2),
])
def test_every_adapter_and_source_trains_end_to_end(synthetic_random, tmp_path, conditioning, adapter, rezero,
                                                    num_paths, horizon):
    plans_dir = None
    if conditioning.startswith("planner"):
        plans_dir = str(write_plan_cache(tmp_path / "plans", synthetic_random, num_paths=3, horizon=horizon))
    plans = PlanConfig(kind=conditioning, num_paths=num_paths, horizon=horizon, plans_dir=plans_dir)
    settings = AdapterSettings(kind=adapter, rezero=rezero)
    out = train_lm(str(synthetic_random), str(tmp_path / "model"), model=LMModelConfig(model_config=TINY),
                   plans=plans, adapter=settings, train=quick())
    manifest = read_manifest(out)
    assert manifest["global_step"] == 2 and np.isfinite(manifest["val_loss"])
    # the reported validation loss is the saved model's, on the validation windows (one batch of 4 here)
    assert manifest["val_loss"] == pytest.approx(rescored_val_loss(out, synthetic_random, num_windows=4), rel=1e-5)
    assert manifest["val_ppl"] == pytest.approx(np.exp(manifest["val_loss"]))
    if adapter == "multipath" and rezero:  # the learned ReZero scalars are reported, and they moved
        assert set(manifest["rezero_alphas"]) == {"alpha_1", "alpha_2"} and manifest["rezero_alphas"]["alpha_2"] != 0
    else:
        assert manifest["rezero_alphas"] is None
    assert (out / "checkpoints" / "last.ckpt").is_file() and list((out / "logs").rglob("metrics.csv"))
    assert list((out / "tb").rglob("events.out.tfevents*"))
    model = PlannedLM.from_pretrained(out)
    assert trained_plans(model).kind == conditioning and (model.adapter is None) == (conditioning == "none")
    if conditioning != "none":
        assert model.config.adapter.kind == adapter  # and the fields of its kind alone: project_avg has no rezero
        assert getattr(model.config.adapter, "rezero", None) == (rezero if adapter == "multipath" else None)
        assert model.config.codebook_hash == PreparedDataset(synthetic_random).codebook_hash
    if plans_dir:  # which planner and plans produced the training plans
        assert trained_plans(model).plans_dir == plans_dir and model.config.planner_hash == "feedbeef"
        assert trained_plans(model).planner_dir == "/somewhere/planner"
        assert not {"plans_dir", "planner_dir"} & set(model.config.plans)  # the folders are the run's, in the card
    # The folder reloads with its tokenizer, and the reloaded model scores text.
    tokenizer = model.load_tokenizer(out)
    ids = torch.tensor([tokenizer("Red blue green.")["input_ids"]])
    assert torch.isfinite(model(ids, labels=ids).loss)
    # Same config again: the complete folder is reused, not retrained.
    stamp = (out / "manifest.json").stat().st_mtime_ns
    assert train_lm(str(synthetic_random), str(out), model=LMModelConfig(model_config=TINY), plans=plans,
                    adapter=settings, train=quick()) == out
    assert (out / "manifest.json").stat().st_mtime_ns == stamp


def test_reported_validation_loss_is_the_saved_models_on_the_whole_validation_split(synthetic_random, tmp_path):
    """Two validations (one per epoch) over every validation window: the manifest's val_loss is the best
    one, and it is the loss of the model that was saved."""
    from planlm.data.windows import article_windows

    out = train_lm(str(synthetic_random), str(tmp_path / "model"), model=LMModelConfig(model_config=TINY),
                   plans=PlanConfig(kind="oracle"),
                   train=quick(max_epochs=2, limit_train_batches=1, limit_val_batches=None, lr=1e-2))
    num_windows = len(article_windows(PreparedDataset(synthetic_random)["validation"], 128, 127))
    assert val_loss(out) == pytest.approx(rescored_val_loss(out, synthetic_random, num_windows), rel=1e-5)
    logged = [float(r["val/loss"]) for r in read_csv(next((out / "logs").rglob("metrics.csv"))) if r.get("val/loss")]
    assert len(logged) == 2 and val_loss(out) == pytest.approx(min(logged))
    from huggingface_hub import ModelCard

    training = ModelCard.load(out / "README.md").data.to_dict()["planlm"]["training"]  # the model card says the same
    assert training["val_loss"] == val_loss(out)
    assert training["corpus_fingerprint"] == PreparedDataset(synthetic_random).manifest["config_fingerprint"]


def test_training_plans_from_a_planner_folder(synthetic_random, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    planner = tiny_planner(prepared, max_sentences=8, horizon=2)
    planner.save_pretrained(tmp_path / "planner")
    out = train_lm(str(synthetic_random), str(tmp_path / "model"), model=LMModelConfig(model_config=TINY),
                   plans=PlanConfig(kind="planner_sampled", num_paths=2, planner_dir=str(tmp_path / "planner")),
                   adapter=AdapterSettings(kind="multipath"), train=quick())
    model = PlannedLM.from_pretrained(out)
    config, trained = model.config, trained_plans(model)
    # T unset: the planner's, read by the plan cache sampled for it and the adapter built for it
    assert trained.horizon == model.adapter.config.horizon == read_manifest(trained.plans_dir)["horizon"] == 2
    planner_dir = (tmp_path / "planner").resolve()
    assert Path(trained.plans_dir).resolve().is_relative_to(planner_dir)  # the default cache inside the planner
    assert Path(trained.planner_dir).resolve() == planner_dir
    assert config.planner_hash == read_manifest(trained.plans_dir)["planner_hash"] and len(config.planner_hash) == 64


def test_training_on_plans_of_an_adaptive_path_policy(synthetic_random, tmp_path):
    from planlm.plans.cache import load_path_counts
    from planlm.plans.policy import PathPolicy

    prepared = PreparedDataset(synthetic_random)
    tiny_planner(prepared, max_sentences=8, horizon=2).save_pretrained(tmp_path / "planner")
    policy = PathPolicy("entropy", min_paths=1, entropy_high=0.5 * float(np.log(prepared.num_actions)))
    out = train_lm(str(synthetic_random), str(tmp_path / "model"), model=LMModelConfig(model_config=TINY),
                   plans=PlanConfig(kind="planner_sampled", num_paths=4, horizon=2, planner_dir=str(tmp_path / "planner"),
                                    path_policy=policy),
                   adapter=AdapterSettings(kind="multipath"), train=quick(limit_train_batches=2))
    trained = trained_plans(PlannedLM.from_pretrained(out))
    assert read_manifest(trained.plans_dir)["config"]["path_policy"]["kind"] == "entropy"  # its own cache
    counts = load_path_counts(trained.plans_dir, "train")
    assert counts.min() >= 1 and counts.max() <= 4
    assert read_manifest(out)["config"]["plans"]["path_policy"]["kind"] == "entropy"  # in the reuse key
    with pytest.raises(PlanlmError, match="path_policy.max_paths 8 differs from --plans.num_paths 4"):
        PlanConfig(kind="planner_sampled", num_paths=4, planner_dir="p",
                   path_policy=PathPolicy("entropy", max_paths=8)).resolve()


def test_retraining_a_planner_or_the_base_lm_into_the_same_folder_retrains_the_lm(synthetic_random, tmp_path):
    from planlm.models.planner import Planner, PlannerConfig

    prepared = PreparedDataset(synthetic_random)

    def save_planner(seed: int) -> str:
        torch.manual_seed(seed)
        planner = Planner(PlannerConfig(num_actions=prepared.num_actions, embedding_dim=prepared.embedding_dim,
                                        d_model=16, num_heads=2, dim_feedforward=32, max_sentences=8, horizon=1))
        planner.prepared_info = {"codebook_hash": prepared.codebook_hash, "num_actions": prepared.num_actions}
        return str(planner.save_pretrained(tmp_path / "planner"))

    def train(base: str) -> dict:
        plans = PlanConfig(kind="planner_argmax", planner_dir=str(tmp_path / "planner"))
        out = train_lm(str(synthetic_random), str(tmp_path / "model"), model=LMModelConfig(init_from=base),
                       plans=plans, train=quick(limit_train_batches=1))
        return read_manifest(out)

    def train_base(seed: int) -> str:
        return str(train_lm(str(synthetic_random), str(tmp_path / "base"), model=LMModelConfig(model_config=TINY),
                            train=quick(limit_train_batches=1, seed=seed)))

    save_planner(0)
    base = train_base(0)
    first = train(base)
    assert train(base)["train_wall_time_s"] == first["train_wall_time_s"]  # nothing changed: reused
    save_planner(1)  # another planner in the same folder: other plans, so the LM is retrained
    second = train(base)
    assert second["planner_hash"] != first["planner_hash"] and second["train_wall_time_s"] != first["train_wall_time_s"]
    train_base(1)  # another base LM in the same folder: retrained again
    third = train(base)
    assert third["config"]["inputs"]["init_from"] != second["config"]["inputs"]["init_from"]
    assert third["train_wall_time_s"] != second["train_wall_time_s"]


def test_resume_continues_from_last_checkpoint(synthetic_random, tmp_path):
    kwargs = dict(model=LMModelConfig(model_config=TINY), plans=PlanConfig(kind="oracle"))
    out = train_lm(str(synthetic_random), str(tmp_path / "model"), train=quick(), **kwargs)
    first = load_file(str(out / "adapter.safetensors"))
    # A longer run of the same config resumes at step 2 instead of starting over.
    assert read_manifest(out)["resumed_from_step"] == 0
    train_lm(str(synthetic_random), str(out), train=quick(max_epochs=2), **kwargs)
    assert read_manifest(out)["global_step"] == 4 and read_manifest(out)["resumed_from_step"] == 2
    logged_steps = []
    for path in sorted((out / "logs").glob("version_*/metrics.csv")):
        logged_steps.append([int(row["step"]) for row in read_csv(path) if row.get("train/loss")])
    assert logged_steps[0] == [0, 1] and logged_steps[1] == [2, 3]
    assert not torch.equal(first["projection.weight"], load_file(str(out / "adapter.safetensors"))["projection.weight"])
    # Another config never resumes a foreign checkpoint: it starts from step 0.
    train_lm(str(synthetic_random), str(out), model=LMModelConfig(model_config=TINY),
             plans=PlanConfig(kind="fixed"), train=quick(limit_train_batches=1))
    assert read_manifest(out)["global_step"] == 1 and read_manifest(out)["resumed_from_step"] == 0


def test_more_max_steps_after_a_run_stopped_inside_an_epoch_trains_them_all(synthetic_random, tmp_path):
    kwargs = dict(model=LMModelConfig(model_config=TINY), plans=PlanConfig(kind="oracle"))
    out = train_lm(str(synthetic_random), str(tmp_path / "model"), train=quick(max_steps=2, max_epochs=1, limit_train_batches=None), **kwargs)
    assert read_manifest(out)["global_step"] == 2
    train_lm(str(synthetic_random), str(out), train=quick(max_steps=5, max_epochs=1, limit_train_batches=None), **kwargs)
    assert read_manifest(out)["global_step"] == 5


def test_frozen_trains_only_the_conditioning_and_lora_merges(synthetic_random, tmp_path):
    import lightning as L

    from planlm.data.resources import load_tokenizer
    from planlm.models.planned_lm import load_causal_lm

    folders = {mode: train_lm(str(synthetic_random), str(tmp_path / mode), plans=PlanConfig(kind="oracle"),
                              train=quick(),
                              model=LMModelConfig(model_config=TINY, finetune=mode, lora_rank=2))
               for mode in ("frozen", "full", "lora")}
    L.seed_everything(0)  # train_lm seeds with train.seed (0) right before it builds the LM: the same init
    init = load_causal_lm(None, TINY, vocab_size=len(load_tokenizer("gpt2"))).state_dict()
    weights = {mode: load_file(str(folder / "lm" / "model.safetensors")) for mode, folder in folders.items()}
    for name, tensor in weights["frozen"].items():  # frozen: the base LM is exactly its init
        torch.testing.assert_close(tensor, init[name], rtol=0, atol=0)
    attention, mlp = "transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_fc.weight"
    assert not torch.equal(weights["full"][mlp], init[mlp])  # full: everything moves
    assert not torch.equal(weights["lora"][attention], init[attention])  # lora: merged into c_attn ...
    torch.testing.assert_close(weights["lora"][mlp], init[mlp], rtol=0, atol=0)  # ... the rest of the base is intact
    for mode in ("frozen", "lora"):  # the conditioning trained in every mode
        adapter = load_file(str(folders[mode] / "adapter.safetensors"))
        assert not torch.equal(adapter["action_embedding.weight"], PreparedDataset(synthetic_random).codebook)
    trainable = {mode: read_manifest(folder)["trainable_parameters"] for mode, folder in folders.items()}
    assert trainable["frozen"] < trainable["lora"] < trainable["full"]
    assert PlannedLM.from_pretrained(folders["lora"]).config.finetune == "lora"
    with pytest.raises(PlanlmError, match="nothing to train"):
        train_lm(str(synthetic_random), str(tmp_path / "bad"), train=quick(),
                 model=LMModelConfig(model_config=TINY, finetune="frozen"), plans=PlanConfig())


def test_multipath_lr_scale_is_the_rate_of_the_gated_transformers_and_scalars(synthetic_random, tmp_path):
    from planlm.train.lm_module import LightningLM

    def train(name: str, scale: float, rezero: bool = True) -> Path:
        return train_lm(str(synthetic_random), str(tmp_path / name), model=LMModelConfig(model_config=TINY),
                        plans=PlanConfig(kind="oracle", num_paths=2, horizon=2),
                        adapter=AdapterSettings(kind="multipath", rezero=rezero),
                        train=quick(lr=1e-2, multipath_lr_scale=scale, batch_size=2, limit_train_batches=4))

    folders = {scale: train(f"scale{scale}", scale) for scale in (1.0, 0.01, 1e-9)}
    planned = PlannedLM.from_pretrained(folders[1.0])
    groups = LightningLM(planned, lr=1e-2, multipath_lr_scale=0.01).configure_optimizers()["optimizer"].param_groups
    names = {id(p): n for n, p in planned.named_parameters()}
    members = [{names[id(p)] for p in g["params"]} for g in groups]
    assert [g["lr"] for g in groups] == [1e-2, 1e-2, 1e-4]
    assert all(n.startswith("lm.") for n in members[0]) and members[1] == {
        "adapter.action_embedding.weight", "adapter.projection.weight", "adapter.projection.bias",
        "adapter.step_position.weight", "adapter.path_input.weight", "adapter.path_input.bias",
        "adapter.alpha_path", "adapter.alpha_sample"}
    assert members[2] == {n for n in names.values() if n.startswith(
        ("adapter.path_transformer.", "adapter.sample_transformer."))}
    # in training (4 steps), the gated weights move in proportion (1e-9: about where they started)
    weights = {scale: load_file(str(folder / "adapter.safetensors")) for scale, folder in folders.items()}
    moved = {scale: {k: float((w[k] - weights[1e-9][k]).norm()) for k in w} for scale, w in weights.items()}
    gated = [k.removeprefix("adapter.") for k in members[2]]
    assert all(0 < moved[0.01][k] < 0.1 * moved[1.0][k] for k in gated if moved[1.0][k] > 0)
    for part in ("path_transformer.", "sample_transformer."):  # PT moves once alpha_1 and alpha_2 have (step 3)
        assert sum(moved[1.0][k] > 0 for k in gated if k.startswith(part)) > len(gated) / 4
    # the no-ReZero ablation has no gate: its transformers are the adapter, at lr whatever the scale
    ablation = {scale: load_file(str(train(f"ablation{scale}", scale, rezero=False) / "adapter.safetensors"))
                for scale in (1.0, 0.01)}
    for name, tensor in ablation[1.0].items():
        torch.testing.assert_close(ablation[0.01][name], tensor, rtol=0, atol=0)
    with pytest.raises(PlanlmError, match="multipath_lr_scale must be > 0"):
        quick(multipath_lr_scale=0.0)


def test_bad_input_gives_one_line_errors(synthetic_random, tmp_path):
    model = LMModelConfig(model_config=TINY)
    other_codebook = write_plan_cache(tmp_path / "other", synthetic_random, 2, 2, codebook_hash="0" * 64)
    with pytest.raises(PlanlmError, match="codebook") as err:
        train_lm(str(synthetic_random), str(tmp_path / "m1"), model=model, train=quick(),
                 plans=PlanConfig(kind="planner_sampled", num_paths=2, horizon=2, plans_dir=str(other_codebook)))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "m1" / "manifest.json").exists()
    plans = write_plan_cache(tmp_path / "plans", synthetic_random, 2, 2)
    with pytest.raises(PlanlmError, match="num_paths"):
        train_lm(str(synthetic_random), str(tmp_path / "m2"), model=model, train=quick(),
                 plans=PlanConfig(kind="planner_sampled", num_paths=3, horizon=2, plans_dir=str(plans)))
    with pytest.raises(PlanlmError, match="horizon"):
        train_lm(str(synthetic_random), str(tmp_path / "m3"), model=model, train=quick(),
                 plans=PlanConfig(kind="planner_argmax", horizon=3, plans_dir=str(plans)))
    # An LM whose vocabulary cannot hold the corpus' GPT-2 token ids.
    with pytest.raises(PlanlmError, match="token embeddings|does not fit"):
        train_lm(str(synthetic_random), str(tmp_path / "m4"), train=quick(),
                 model=LMModelConfig(model_config={**TINY, "vocab_size": 1000}))
    # A model folder trained with another tokenizer than the prepared corpus'.
    base = train_lm(str(synthetic_random), str(tmp_path / "base"), model=model, train=quick(limit_train_batches=1))
    config = json.loads((base / "planned_lm.json").read_text())
    config["tokenizer"] = "some-other-tokenizer"
    (base / "planned_lm.json").write_text(json.dumps(config))
    manifest = read_manifest(base)  # re-recorded: a folder written so, not one damaged after it was written
    write_json(base / "manifest.json", {**manifest, "files": record_files(base)})
    with pytest.raises(PlanlmError, match="tokenizer"):
        train_lm(str(synthetic_random), str(tmp_path / "m5"), train=quick(), model=LMModelConfig(init_from=str(base)))
    with pytest.raises(PlanlmError, match="plans_dir"):
        train_lm(str(synthetic_random), str(tmp_path / "m7"), model=model, train=quick(),
                 plans=PlanConfig(kind="planner_sampled"))
    with pytest.raises(PlanlmError, match="--plans.kind 'sometimes': choose one of none, fixed"):
        PlanConfig(kind="sometimes")


def test_a_pretrained_lm_with_another_tokenizer_is_refused(synthetic_random, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from planlm.models.planned_lm import load_causal_lm

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "red": 1, "blue": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "other-lm"
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(folder)
    load_causal_lm(None, {**TINY, "vocab_size": 50257}).save_pretrained(folder)
    with pytest.raises(PlanlmError, match="does not match the tokenizer") as err:
        train_lm(str(synthetic_random), str(tmp_path / "model"), train=quick(),
                 model=LMModelConfig(name_or_path=str(folder)))
    assert "manifest.json" in str(err.value) and "\n" not in str(err.value)
    # The same folder without its tokenizer is accepted: its vocabulary holds the corpus' ids.
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(folder / name, weights_only / name)
    out = train_lm(str(synthetic_random), str(tmp_path / "model"), train=quick(limit_train_batches=1),
                   model=LMModelConfig(name_or_path=str(weights_only)))
    assert PlannedLM.from_pretrained(out).config.base_model == str(weights_only)


def test_init_from_a_planned_lm_folder_keeps_its_weights(synthetic_random, tmp_path):
    base = train_lm(str(synthetic_random), str(tmp_path / "base"), model=LMModelConfig(model_config=TINY),
                    train=quick(limit_train_batches=1))
    out = train_lm(str(synthetic_random), str(tmp_path / "next"), model=LMModelConfig(init_from=str(base),
                   finetune="frozen"), plans=PlanConfig(kind="oracle"), train=quick())
    torch.testing.assert_close(load_file(str(out / "lm" / "model.safetensors")),
                               load_file(str(base / "lm" / "model.safetensors")))
    assert PlannedLM.from_pretrained(out).config.base_model_config == TINY


def test_cli_train_lm(synthetic_random, tmp_path, capsys):
    out = tmp_path / "cli-model"
    args = ["train-lm", "--prepared_dir", str(synthetic_random), "--out_dir", str(out),
            "--model.model_config", json.dumps(TINY), "--plans.kind", "oracle",
            "--adapter.kind", "multipath", "--plans.num_paths", "2", "--plans.horizon", "2",
            "--train.limit_train_batches", "1", "--train.batch_size", "4", "--train.limit_val_batches", "1"]
    cli_main(args)
    model = PlannedLM.from_pretrained(out)
    assert model.config.adapter.kind == "multipath" and trained_plans(model).num_paths == 2
    assert trained_plans(model).kind == "oracle"
    assert read_manifest(out)["global_step"] == 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train-lm", "--prepared_dir", str(tmp_path / "missing"), "--out_dir", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("planlm: error:") and "manifest.json missing" in err and "\n" not in err
    shutil.rmtree(tmp_path / "x", ignore_errors=True)


def test_a_llama_family_lm_trains_with_lora_and_plans(synthetic_random, tmp_path):
    llama = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
             "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128}
    out = train_lm(str(synthetic_random), str(tmp_path / "llama"), train=quick(limit_train_batches=1),
                   model=LMModelConfig(model_config=llama, finetune="lora", lora_rank=2),
                   plans=PlanConfig(kind="oracle", num_paths=2, horizon=2), adapter=AdapterSettings(kind="multipath"))
    model = PlannedLM.from_pretrained(out)
    assert model.lm.config.model_type == "llama" and np.isfinite(read_manifest(out)["val_loss"])
    # LoRA was on: only the rank-2 matrices and the adapter trained, and LoRA was merged into the attention
    import lightning as L

    from planlm.data.resources import load_tokenizer
    from planlm.models.planned_lm import load_causal_lm

    assert model.config.finetune == "lora"
    L.seed_everything(0)  # train_lm seeds with train.seed (0) right before it builds the LM: the same init
    init = load_causal_lm(None, llama, vocab_size=len(load_tokenizer("gpt2"))).state_dict()
    weights = load_file(str(out / "lm" / "model.safetensors"))
    lora_parameters = (2 * 32 + 32 * 2) + (2 * 32 + 16 * 2)  # rank 2 on q_proj (32 -> 32), v_proj (32 -> 16)
    adapter_parameters = sum(p.numel() for p in model.adapter.parameters())
    assert read_manifest(out)["trainable_parameters"] == lora_parameters + adapter_parameters
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight"):
        assert not torch.equal(weights[name], init[name])  # LoRA merged
    for name in ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                 "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.embed_tokens.weight"):
        torch.testing.assert_close(weights[name], init[name], rtol=0, atol=0)  # the base is intact
    adapter = load_file(str(out / "adapter.safetensors"))
    assert adapter["projection.weight"].abs().sum() > 0 and float(adapter["alpha_sample"]) != 0  # moved from 0


def test_the_lm_and_the_adapter_are_clipped_apart(oracle_planned_lm):
    """A large adapter gradient does not shrink the LM's step (a plan's gradient collects every token's and is
    about as large as the whole LM's); each part is clipped to the norm on its own."""
    from planlm.train.lm_module import LightningLM

    model = oracle_planned_lm
    adapter = {id(p) for p in model.adapter.parameters()}
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-5 if id(p) not in adapter else 1.0)
    lm_grads = {n: p.grad.clone() for n, p in model.named_parameters() if id(p) not in adapter}
    LightningLM(model).configure_gradient_clipping(None, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
    for name, p in model.named_parameters():
        if id(p) not in adapter:
            torch.testing.assert_close(p.grad, lm_grads[name], rtol=0, atol=0)  # its norm (~0.04) is below 1
    adapter_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.adapter.parameters()]))
    assert adapter_norm == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize("lm_grad, adapter_grad", [(0.1, 1e-5), (0.1, 1.0)])
def test_an_lm_gradient_above_the_norm_is_clipped_apart(oracle_planned_lm, lm_grad, adapter_grad):
    """Clipping apart clips the LM's own group too: an LM gradient norm above the threshold comes out at the
    threshold, whatever the adapter's; an adapter gradient below it is left as it was."""
    from planlm.train.lm_module import LightningLM

    model = oracle_planned_lm
    adapter = {id(p) for p in model.adapter.parameters()}
    for p in model.parameters():
        p.grad = torch.full_like(p, lm_grad if id(p) not in adapter else adapter_grad)

    def norm(params) -> float:  # in float64: torch's float32 norm of 1.6M equal entries is 4e-4 off
        return float(sum(p.grad.double().square().sum() for p in params)) ** 0.5

    lm_params = [p for p in model.parameters() if id(p) not in adapter]
    adapter_before = norm(model.adapter.parameters())
    assert norm(lm_params) > 10.0  # well above the threshold of 1
    LightningLM(model).configure_gradient_clipping(None, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
    assert norm(lm_params) == pytest.approx(1.0, rel=1e-3)
    assert norm(model.adapter.parameters()) == pytest.approx(min(adapter_before, 1.0), rel=1e-3)
