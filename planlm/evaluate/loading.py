"""Loading what the evaluation commands evaluate: planned-LM and planner folders, checked against the
prepared corpus, and the weights' fingerprint that keys the evaluation folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.errors import PlanlmError
from planlm.files import file_sha256
from planlm.jsonio import fingerprint
from planlm.models.planner import planner_hash
from planlm.stage import config_fingerprint


def load_model(model_dir: str | Path):
    """A PlannedLM from a ``train-lm`` folder, or a bare HF causal-LM folder wrapped as plans kind ``none``."""
    from planlm.models.planned_lm import PlannedLM, PlannedLMConfig

    from planlm.plans.registry import plan_kind
    from planlm.plugins import PluginImportError, UnknownKind

    model_dir = Path(model_dir)
    if (model_dir / "planned_lm.json").is_file():
        model = PlannedLM.from_pretrained(model_dir)  # its adapter, by the kind it records
        try:
            plan_kind(model.config.plans["kind"])  # its plans kind: a class of someone's own is imported now
        except (PluginImportError, UnknownKind) as e:
            raise e.at(str(model_dir)) from None
        return model
    if (model_dir / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        from planlm.stage.integrity import reading

        with reading(model_dir, fix="give an intact HF model folder (save_pretrained) or a `planlm train-lm` folder"):
            lm = AutoModelForCausalLM.from_pretrained(str(model_dir))
        return PlannedLM(PlannedLMConfig(tokenizer=str(model_dir)), lm)
    raise PlanlmError(f"{model_dir}: no model here (neither planned_lm.json nor an HF config.json); give the out_dir "
                      f"of a finished `planlm train-lm` or an HF model folder")


def model_fingerprint(model_dir: str | Path) -> str:
    """Identity of a model folder for the evaluation cache key: the hashes of its weight files."""
    model_dir = Path(model_dir)
    files = sorted(p for p in model_dir.rglob("*.safetensors") if "checkpoints" not in p.parts)
    files += sorted(model_dir.rglob("*.json")) if not files else []
    return fingerprint({str(p.relative_to(model_dir)): file_sha256(p) for p in files})


def evaluation_inputs(model_dir: str | Path, prepared_dir: str | Path, planner_dir: str | Path | None) -> dict:
    """The part of an evaluation's reuse key that says what the folders it reads hold, not only where they lie (a
    retrained model or planner keeps its path): the model's weights, the prepared corpus's key, the planner's
    weights (None without one)."""
    return {"model": model_fingerprint(model_dir), "prepared": config_fingerprint(prepared_dir),
            "planner": planner_hash(planner_dir)}


def load_checked(model_dir: str, prepared_dir: str, split: str):
    """(prepared dataset, split view, model) after checking that the model fits the prepared corpus."""
    prepared = PreparedDataset(prepared_dir)
    split_view = prepared.split(split)
    model = load_model(model_dir)
    check_compatible(model, prepared, split_view, model_dir)
    return prepared, split_view, model


def check_compatible(model, prepared: PreparedDataset, split: PreparedSplit, model_dir: str) -> None:
    config = model.config
    vocab = model.lm.get_input_embeddings().num_embeddings
    if split.num_tokens and int(np.max(split.input_ids)) >= vocab:
        raise PlanlmError(f"{split.path}/input_ids.npy: token id {int(np.max(split.input_ids))} is outside the "
                          f"{vocab}-token vocabulary of {model_dir}; evaluate on a corpus prepared with the model's "
                          f"tokenizer")
    if (Path(model_dir) / "planned_lm.json").is_file() and config.tokenizer != prepared.tokenizer_name:
        raise PlanlmError(f"{model_dir}/planned_lm.json: tokenizer {config.tokenizer!r} differs from the prepared "
                          f"corpus's {prepared.tokenizer_name!r} ({prepared.path}); evaluate on a corpus prepared "
                          f"with the model's tokenizer")
    if model.adapter is not None:
        if config.codebook_hash and config.codebook_hash != prepared.codebook_hash:
            raise PlanlmError(f"{model_dir}/planned_lm.json: the adapter was trained on codebook "
                              f"{config.codebook_hash[:12]} but {prepared.path} has {prepared.codebook_hash[:12]}; "
                              f"evaluate on the prepared corpus the model was trained on")
        if model.adapter.config.num_actions != prepared.num_actions:
            raise PlanlmError(f"{model_dir}: the adapter knows {model.adapter.config.num_actions} actions but "
                              f"{prepared.path} has {prepared.num_actions}; evaluate on the corpus it was trained on")
