"""train-lm keeps the best validation checkpoint (not the last) and init_from carries a trained adapter over."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers import read_csv, tiny_gpt2_config
from planlm.models.adapter import AdapterSettings
from planlm.plans.config import PlanConfig
from planlm.stage import read_manifest
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm


def checkpoint_lm(path: Path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return {name[len("model.lm."):]: tensor for name, tensor in state.items() if name.startswith("model.lm.")}


def test_train_lm_saves_the_best_checkpoint_not_the_last(synthetic_random, tmp_path):
    """A learning rate so large that validation gets worse after the first steps: the folder holds the weights
    of the best validation, which are not the last ones."""
    out = train_lm(str(synthetic_random), str(tmp_path / "model"), model=LMModelConfig(model_config=tiny_gpt2_config()),
                   plans=PlanConfig(kind="none"),
                   train=LMTrainConfig(batch_size=4, lr=0.3, max_steps=4, val_check_interval=2, limit_val_batches=2,
                                       gradient_clip_val=None, log_every_n_steps=1))
    manifest = read_manifest(out)
    losses = [float(row["val/loss"]) for row in read_csv(next((out / "logs").glob("version_*/metrics.csv")))
              if row.get("val/loss")]
    assert len(losses) == 2 and min(losses) < losses[-1], losses  # the last validation is not the best
    best = Path(manifest["best_checkpoint"])
    assert best.name == f"step{2 * losses.index(min(losses)) + 2}.ckpt" and manifest["val_loss"] == min(losses)
    saved = load_file(str(out / "lm" / "model.safetensors"))
    for name, tensor in checkpoint_lm(best).items():
        if name in saved:  # the output projection is tied to the embeddings (saved once)
            torch.testing.assert_close(saved[name], tensor, rtol=0, atol=0)
    # last.ckpt (what a rerun resumes from) is the final state, although the last validation did not improve.
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == manifest["global_step"] == 4
    last = checkpoint_lm(out / "checkpoints" / "last.ckpt")
    assert not torch.equal(saved["transformer.wte.weight"], last["transformer.wte.weight"])
    # The best checkpoint is read back, never resumed: its weights alone (a third of a whole AdamW state's bytes);
    # last.ckpt keeps everything a resumed run needs.
    best_keys = set(torch.load(best, map_location="cpu", weights_only=True))
    last_keys = set(torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True))
    assert "state_dict" in best_keys and not best_keys & {"optimizer_states", "lr_schedulers", "callbacks"}, best_keys
    assert {"optimizer_states", "lr_schedulers", "callbacks"} <= last_keys, last_keys
    assert best.stat().st_size < (out / "checkpoints" / "last.ckpt").stat().st_size / 2
    assert manifest["call_time_s"]["best_reload"] > 0  # training went on after the best: it was read back


def test_a_call_records_where_its_time_went_and_skips_reloading_the_weights_it_holds(synthetic_random, tmp_path):
    """One validation, at the end: the best checkpoint holds the weights in memory, so it is not read back (and the
    saved model equals it bit for bit); the manifest splits the call's wall time by part."""
    out = train_lm(str(synthetic_random), str(tmp_path / "model"), model=LMModelConfig(model_config=tiny_gpt2_config()),
                   plans=PlanConfig(kind="none"),
                   train=LMTrainConfig(batch_size=4, lr=1e-3, max_epochs=1, limit_train_batches=3, limit_val_batches=2))
    manifest = read_manifest(out)
    times = manifest["call_time_s"]
    assert times["best_reload"] == 0 and times["train_steps"] == manifest["global_step"] == 3
    parts = ("setup", "steps", "validation", "checkpoints", "fit_other", "best_reload", "save")
    assert all(times[part] >= 0 for part in parts) and times["steps"] > 0 and times["checkpoints"] > 0
    assert sum(times[part] for part in parts) <= times["call"] + 0.01
    assert times["outside_steps_share"] == round(1 - times["steps"] / times["call"], 4)
    saved = load_file(str(out / "lm" / "model.safetensors"))
    for name, tensor in checkpoint_lm(Path(manifest["best_checkpoint"])).items():
        if name in saved:
            torch.testing.assert_close(saved[name], tensor, rtol=0, atol=0)


def test_init_from_a_planned_lm_carries_its_adapter_over(synthetic_random, tmp_path):
    plans = dict(plans=PlanConfig(kind="oracle", num_paths=2, horizon=2), adapter=AdapterSettings(kind="multipath"))
    quick = dict(batch_size=4, limit_train_batches=2, limit_val_batches=1)
    first = train_lm(str(synthetic_random), str(tmp_path / "first"), **plans,
                     model=LMModelConfig(model_config=tiny_gpt2_config()), train=LMTrainConfig(lr=1e-2, **quick))
    trained = load_file(str(first / "adapter.safetensors"))
    assert trained["projection.weight"].abs().max() > 0  # moved away from its zero (no-op) initialisation
    # A second run from the first: with a vanishing learning rate, it ends where it started.
    second = train_lm(str(synthetic_random), str(tmp_path / "second"), **plans,
                      model=LMModelConfig(init_from=str(first)), train=LMTrainConfig(lr=1e-12, seed=1, **quick))
    carried = load_file(str(second / "adapter.safetensors"))
    for name, tensor in trained.items():
        torch.testing.assert_close(carried[name], tensor, rtol=0, atol=1e-6, msg=name)
    first_lm, second_lm = (load_file(str(f / "lm" / "model.safetensors")) for f in (first, second))
    torch.testing.assert_close(second_lm["transformer.h.0.mlp.c_fc.weight"], first_lm["transformer.h.0.mlp.c_fc.weight"],
                               rtol=0, atol=1e-6)
    # Another adapter shape cannot be carried over: it starts fresh (projection zero).
    other = train_lm(str(synthetic_random), str(tmp_path / "other"),
                     plans=PlanConfig(kind="oracle"), adapter=AdapterSettings(kind="project_avg"),
                     model=LMModelConfig(init_from=str(first)), train=LMTrainConfig(lr=1e-12, **quick))
    assert load_file(str(other / "adapter.safetensors"))["projection.weight"].abs().max() < 1e-6
