"""``planlm train-lm``: finetune a causal LM conditioned on plans (section 3.3 of the paper).

``LightningLM`` (``lm_module.py``) holds only the steps and the optimiser; the network is
``planlm.models.planned_lm.PlannedLM``.
The output folder is a ``PlannedLM`` folder (reload it with ``PlannedLM.from_pretrained(out_dir)``)
plus ``checkpoints/`` (best + last, for resume, under ``checkpoints.fingerprint``), ``logs/`` (CSV) and
``tb/`` (TensorBoard; see --train.loggers), and is complete only once its ``manifest.json`` is written.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from planlm.models.adapter import AdapterConfig
from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.data.windows import WindowCollator, article_windows, make_action_source
from planlm.models.planned_lm import Conditioning, PlannedLM, PlannedLMConfig, load_causal_lm
from planlm.plans.policy import PathPolicy, policy_keyed
from planlm.train.harness import (DEFAULT_LOGGERS, TrainerKnobs, build_trainer, check_loggers, fit, load_best,
                                  resume_checkpoint)
from planlm.train.lm_module import LightningLM
from planlm.train.resume import EpochShuffle
from planlm.utils import (PlanlmError, check_bf16, derive_seed, file_sha256, prepare_stage_dir,
                          read_manifest, write_manifest)

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 2, "n_positions": 128}


@dataclass
class LMModelConfig:
    """Which LM to condition and how to finetune it."""

    name_or_path: str | None = None
    """Pretrained LM: hub name (e.g. gpt2, the paper's), local folder, .gguf file or smollm2-135m (offline, exported
    once to safetensors); takes precedence over model_config."""
    model_config: dict | None = field(default_factory=lambda: dict(TINY_GPT2))
    """Random-init LM config (AutoConfig.for_model keys incl. model_type), used when name_or_path and init_from are null."""
    init_from: str | None = None
    """A finished planned-LM folder to start from (its LM; also its adapter when the adapter shape matches)."""
    finetune: Literal["full", "frozen", "lora"] = "full"
    """full (the paper), frozen (base LM frozen, only the conditioning trained) or lora (peft)."""
    lora_rank: int = 8
    """LoRA rank r."""
    lora_alpha: int = 16
    """LoRA scaling alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_target_modules: list[str] | None = None
    """Modules LoRA wraps (None: peft's default for the architecture)."""

    def __post_init__(self):
        if self.finetune not in ("full", "frozen", "lora"):
            raise PlanlmError(f"--model.finetune {self.finetune!r}: choose full, frozen or lora")
        if not (self.name_or_path or self.model_config or self.init_from):
            raise PlanlmError("--model: set name_or_path, model_config or init_from")
        if self.lora_rank < 1:
            raise PlanlmError(f"--model.lora_rank must be >= 1 (got {self.lora_rank})")


@dataclass
class ConditioningConfig:
    """Where the plans come from and how the adapter folds them into one vector per sentence."""

    conditioning: Conditioning = "none"
    """none (plain LM), fixed (one constant action), oracle (true actions), planner_argmax, planner_sampled."""
    adapter: Literal["project_avg", "multipath"] = "project_avg"
    """project_avg (Project and Avg) or multipath (PathTransformer + SampleTransformer)."""
    rezero: bool = True
    """multipath: ReZero scalars initialised to zero around Project-and-Avg (False: the paper's ablation)."""
    num_paths: int = 1
    """K paths per plan."""
    horizon: int = 1
    """T steps per path."""
    temperature: float = 1.0
    """Planner sampling temperature (planner_sampled with planner_dir)."""
    fixed_action: int = 0
    """The action of the fixed baseline."""
    plans_dir: str | None = None
    """A plan cache folder (`planlm sample-plans`); for planner_* conditioning."""
    planner_dir: str | None = None
    """A planner folder: its plan cache is sampled (or reused) when plans_dir is not given."""
    seed: int = 0
    """Seed of the sampled plans."""
    action_dim: int | None = None
    """Width of the action embedding (None: the codebook width)."""
    num_layers: int = 1
    """multipath: layers of PathTransformer and SampleTransformer."""
    num_heads: int = 2
    """multipath: attention heads (must divide the LM width)."""
    dim_feedforward: int | None = None
    """multipath: feed-forward width (None: 2 x the LM width)."""
    init_from_codebook: bool = True
    """Initialise the action embedding from the codebook centroids."""
    init_no_op: bool = True
    """Zero-initialise the adapter's projection so training starts from the unconditioned LM."""
    path_policy: PathPolicy = field(default_factory=PathPolicy)
    """planner_sampled with planner_dir: paths per boundary of the sampled plan cache (fixed: num_paths
    everywhere; entropy or converge: at most num_paths, so the adapter trains on variable K)."""

    def __post_init__(self):
        kinds = ("none", "fixed", "oracle", "planner_argmax", "planner_sampled")
        if self.conditioning not in kinds:
            raise PlanlmError(f"--conditioning.conditioning {self.conditioning!r}: choose one of {', '.join(kinds)}")
        if self.num_paths < 1 or self.horizon < 1:
            raise PlanlmError(f"--conditioning.num_paths ({self.num_paths}) and horizon ({self.horizon}) must be >= 1")
        if self.temperature < 0:
            raise PlanlmError(f"--conditioning.temperature must be >= 0 (got {self.temperature})")
        if self.path_policy.max_paths not in (None, self.num_paths):
            raise PlanlmError(f"--conditioning.path_policy.max_paths {self.path_policy.max_paths} differs from "
                              f"--conditioning.num_paths {self.num_paths}; leave max_paths unset (K = num_paths)")
        self.path_policy.resolve(self.num_paths)  # min_paths <= K
        if self.conditioning.startswith("planner") and not (self.plans_dir or self.planner_dir):
            raise PlanlmError(f"--conditioning.conditioning {self.conditioning} needs --conditioning.plans_dir "
                              f"or --conditioning.planner_dir")


@dataclass
class LMTrainConfig:
    """Run knobs (the paper's defaults: context 128, stride 127, batch 32, lr 1e-4)."""

    context_length: int = 128
    """Tokens per window (windows never cross articles)."""
    stride: int = 127
    """Tokens between window starts (context_length - 1: every token predicted once)."""
    batch_size: int = 32
    """Windows per batch (per device)."""
    accumulate_grad_batches: int = 1
    """Gradient accumulation steps."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adapter_lr: float | None = None
    """Learning rate of the conditioning parameters (the adapter; None: lr). The adapter starts as a no-op
    on an LM that is already trained, so a higher rate lets the plan channel open within a short finetune."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps (constant afterwards)."""
    max_epochs: int = 1
    """Epochs over the training windows (ignored when max_steps > 0 ends training first)."""
    max_steps: int = -1
    """Optimiser steps (-1: no limit)."""
    val_check_interval: int | float | None = None
    """Validate every this many training batches (int) or fraction of an epoch (float); None: each epoch."""
    limit_train_batches: int | float | None = None
    """Use only this many (int) or this fraction (float) of training batches per epoch."""
    limit_val_batches: int | float | None = None
    """Use only this many (int) or this fraction (float) of validation batches."""
    gradient_clip_val: float | None = 1.0
    """Clip the gradient norm (None: no clipping)."""
    train_split: str = "train"
    """Prepared split to train on."""
    val_split: str = "validation"
    """Held-out prepared split for validation loss / perplexity (best checkpoint)."""
    seed: int = 0
    """Run seed: the LM's init, the adapter's init, the order of the windows and dropout each draw from a
    stream of their own, so every condition of a run starts from the same weights and sees the same data."""
    accelerator: str = "auto"
    """Lightning accelerator (auto, cpu, gpu, ...)."""
    devices: int | str = "auto"
    """Lightning devices."""
    strategy: str = "auto"
    """Lightning strategy (auto, ddp, ...)."""
    num_nodes: int = 1
    """Lightning nodes."""
    precision: str | None = None
    """Lightning precision (None: bf16-mixed on CUDA, 32-true on CPU). bf16-mixed on CPU is bf16 autocast: about
    2x the tokens/s of 32-true on CPUs with AVX512-BF16 / AMX (refused on CPUs without)."""
    num_workers: int = 0
    """DataLoader worker processes."""
    log_every_n_steps: int = 50
    """Logging interval in steps."""
    loggers: list[str] = field(default_factory=lambda: list(DEFAULT_LOGGERS))
    """Where metrics are logged: csv and tensorboard (default), wandb, mlflow or comet (when installed), or a
    Lightning Logger class path (module.Class)."""
    progress_bar: bool = True
    """Show the progress bar."""
    resume: bool = True
    """Resume from checkpoints/last.ckpt of an interrupted run with the same config."""

    def __post_init__(self):
        if self.context_length < 2:
            raise PlanlmError(f"--train.context_length must be >= 2 (got {self.context_length})")
        if not 1 <= self.stride <= self.context_length - 1:
            raise PlanlmError(f"--train.stride {self.stride} must be in [1, context_length - 1]")
        for name in ("batch_size", "accumulate_grad_batches", "max_epochs", "num_nodes", "log_every_n_steps"):
            if getattr(self, name) < 1:
                raise PlanlmError(f"--train.{name} must be >= 1 (got {getattr(self, name)})")
        if self.lr <= 0 or (self.adapter_lr is not None and self.adapter_lr <= 0):
            raise PlanlmError(f"--train.lr and --train.adapter_lr must be > 0 (got {self.lr}, {self.adapter_lr})")
        check_loggers(self.loggers, "--train.loggers")


# --------------------------------------------------------------------------------------------- inputs
def _check_tokenizer(prepared: PreparedDataset, model: LMModelConfig, init_config: PlannedLMConfig | None):
    """The corpus tokenizer, after checking that the LM was built for the same token ids."""
    from planlm.data.resources import load_tokenizer

    tokenizer = load_tokenizer(prepared.tokenizer_name)
    manifest = prepared.path / "manifest.json"
    if init_config is not None and init_config.tokenizer != prepared.tokenizer_name:
        raise PlanlmError(f"{manifest}: tokenizer {prepared.tokenizer_name!r} but --model.init_from {model.init_from} "
                          f"was trained with {init_config.tokenizer!r}; prepare the corpus with that tokenizer")
    if model.name_or_path and not model.init_from and model.name_or_path != prepared.tokenizer_name:
        try:
            model_tokenizer = load_tokenizer(model.name_or_path)
        except PlanlmError:
            model_tokenizer = None
        if model_tokenizer is not None and len(model_tokenizer) <= 1:
            model_tokenizer = None  # transformers builds an empty tokenizer from a folder without tokenizer files
        # Without a tokenizer (a weights-only folder) the check of the vocabulary size still applies.
        if model_tokenizer is not None and model_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise PlanlmError(f"{manifest}: tokenizer {prepared.tokenizer_name!r} does not match the tokenizer of "
                              f"--model.name_or_path {model.name_or_path}; prepare the corpus with "
                              f"`planlm prepare --tokenizer {model.name_or_path}`")
    return tokenizer


def _plan_arrays(cond: ConditioningConfig, prepared: PreparedDataset, splits: list[str]):
    """(plans_dir, plan-cache manifest, {split: sampled (N, K, T) or argmax (N, T) array}, {split: paths per
    boundary (N,) or None})."""
    if not cond.conditioning.startswith("planner"):
        return None, None, {}, {}
    from planlm.plans.cache import load_path_counts
    from planlm.plans.sampling import sample_plans

    plans_dir = cond.plans_dir
    if plans_dir is None:
        policy = cond.path_policy if cond.conditioning == "planner_sampled" else PathPolicy()
        plans_dir = str(sample_plans(planner_dir=cond.planner_dir, prepared_dir=str(prepared.path), splits=splits,
                                     num_paths=cond.num_paths, horizon=cond.horizon,
                                     temperature=cond.temperature, seed=cond.seed, path_policy=policy))
    plans_path = Path(plans_dir)
    manifest = read_manifest(plans_path)
    if manifest is None:
        raise PlanlmError(f"{plans_path}: not a complete plan cache (manifest.json missing); "
                          f"run `planlm sample-plans --out_dir {plans_path}` first")
    where = plans_path / "manifest.json"
    if manifest.get("codebook_hash") != prepared.codebook_hash or int(manifest.get("num_actions", -1)) != prepared.num_actions:
        raise PlanlmError(f"{where}: plans come from a planner with another codebook (codebook_hash "
                          f"{str(manifest.get('codebook_hash'))[:12]}, {manifest.get('num_actions')} actions) than "
                          f"{prepared.path} ({prepared.codebook_hash[:12]}, {prepared.num_actions}); resample the plans "
                          f"with a planner trained on this corpus")
    if int(manifest["horizon"]) != cond.horizon:
        raise PlanlmError(f"{where}: cached horizon T={manifest['horizon']} but --conditioning.horizon "
                          f"{cond.horizon}; set horizon: {manifest['horizon']} or sample plans with T={cond.horizon}")
    if cond.conditioning == "planner_sampled" and int(manifest["num_paths"]) != cond.num_paths:
        raise PlanlmError(f"{where}: cached K={manifest['num_paths']} paths but --conditioning.num_paths "
                          f"{cond.num_paths}; set num_paths: {manifest['num_paths']} or sample plans with K={cond.num_paths}")
    from planlm.plans.cache import load_plans

    arrays = {split: load_plans(plans_path, split, prepared=prepared, argmax=cond.conditioning == "planner_argmax")
              for split in splits}
    return str(plans_path), manifest, arrays, {split: load_path_counts(plans_path, split) for split in splits}


def _loader(split: PreparedSplit, windows: list, source, batch_size: int, shuffle: bool, num_workers: int,
            pad_token_id: int, seed: int) -> DataLoader:
    return DataLoader(windows, batch_size=batch_size, sampler=data_order(windows, seed) if shuffle else None,
                      num_workers=num_workers, collate_fn=WindowCollator(split, source, pad_token_id), drop_last=False)


def data_order(windows: list, seed: int) -> EpochShuffle:
    """The sampler that shuffles the training windows: each epoch's order from (a stream of the run seed of
    its own, epoch) alone, so every condition of a run (whatever its adapter and its number of parameters)
    sees the same windows in the same order, and a resumed run the batches the interrupted one would have."""
    return EpochShuffle(windows, derive_seed(seed, "data_order"))


def _shuffled_plans_loader(loader: DataLoader) -> DataLoader:
    """The validation loader with the plans shuffled across the split's sentences (plan usage)."""
    from planlm.evaluate.plan_usage import ShuffledPlans, plan_permutation

    collator = loader.collate_fn
    permutation = plan_permutation(collator.split.num_sentences)
    shuffled = WindowCollator(collator.split, ShuffledPlans(collator.source, permutation), collator.pad_token_id)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, shuffle=False, num_workers=loader.num_workers,
                      collate_fn=shuffled)


def _build_model(prepared: PreparedDataset, model: LMModelConfig, cond: ConditioningConfig, tokenizer,
                 provenance: dict, train_split_name: str, seed: int) -> PlannedLM:
    """The LM (a random init drawn from ``seed``, the same for every condition) plus its adapter, drawn
    from a stream of its own so that it shifts nothing else."""
    L.seed_everything(seed, verbose=False)
    init = PlannedLM.from_pretrained(model.init_from) if model.init_from else None
    if init is not None and init.config.codebook_hash not in (None, prepared.codebook_hash) \
            and cond.conditioning != "none":
        raise PlanlmError(f"{Path(model.init_from) / 'planned_lm.json'}: trained on another codebook than "
                          f"{prepared.path}; start from a model of this corpus or from a plain LM")
    lm = init.lm if init is not None else load_causal_lm(model.name_or_path, model.model_config, len(tokenizer))
    train_split = prepared[train_split_name]
    max_id = int(np.max(train_split.input_ids)) if train_split.num_tokens else 0
    if max_id >= lm.get_input_embeddings().num_embeddings:
        raise PlanlmError(f"{prepared.path}: token id {max_id} does not fit the LM's "
                          f"{lm.get_input_embeddings().num_embeddings} embeddings; use an LM of tokenizer "
                          f"{prepared.tokenizer_name!r}")
    if cond.conditioning == "fixed" and not 0 <= cond.fixed_action < prepared.num_actions:
        raise PlanlmError(f"--conditioning.fixed_action {cond.fixed_action}: {prepared.path} has actions "
                          f"0..{prepared.num_actions - 1}")
    adapter = None
    if cond.conditioning != "none":
        adapter = AdapterConfig(
            adapter=cond.adapter, num_actions=prepared.num_actions,
            action_dim=cond.action_dim or prepared.embedding_dim,
            hidden_size=lm.get_input_embeddings().embedding_dim, horizon=cond.horizon, num_layers=cond.num_layers,
            num_heads=cond.num_heads, dim_feedforward=cond.dim_feedforward, rezero=cond.rezero,
            init_from_codebook=cond.init_from_codebook, init_no_op=cond.init_no_op)
    config = PlannedLMConfig(
        conditioning=cond.conditioning, adapter=adapter, num_paths=cond.num_paths, horizon=cond.horizon,
        temperature=cond.temperature, fixed_action=cond.fixed_action, seed=cond.seed,
        tokenizer=prepared.tokenizer_name, num_actions=prepared.num_actions, codebook_hash=prepared.codebook_hash,
        base_model=model.name_or_path or (init.config.base_model if init else None),
        base_model_config=None if model.name_or_path else (init.config.base_model_config if init else model.model_config),
        **provenance)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "adapter"))
        planned = PlannedLM(config, lm, prepared.codebook)
    if init is not None and init.adapter is not None and planned.adapter is not None \
            and asdict(init.config.adapter) == asdict(adapter):
        planned.adapter.load_state_dict(init.adapter.state_dict())
    if model.finetune == "frozen" and planned.adapter is None and lm_is_pretrained(model):
        planned.lm.requires_grad_(False)  # "none" on a frozen pretrained base: the base itself, validated only
        planned.config.finetune = "frozen"
    else:
        planned.apply_finetune(model.finetune, model.lora_rank, model.lora_alpha, model.lora_dropout,
                               model.lora_target_modules)
    return planned.train()  # from_pretrained (init_from) leaves the modules in eval mode: no dropout


def lm_is_pretrained(model: LMModelConfig) -> bool:
    """Whether the LM starts from trained weights (a pretrained name or GGUF file, or a planned-LM folder)."""
    return bool(model.name_or_path or model.init_from)


def _input_hashes(model: LMModelConfig, cond: ConditioningConfig) -> dict:
    """What the folders a run reads hold, not only their names: the weights of the planner that makes the
    plans (or the plan cache's key) and of the LM it starts from, so that retraining either into the same
    folder retrains this LM instead of reusing it."""
    from planlm.evaluate.loading import model_fingerprint
    from planlm.models.planner import planner_hash

    hashes = {"init_from": model_fingerprint(model.init_from) if model.init_from else None}
    if cond.conditioning.startswith("planner") and cond.plans_dir:
        hashes["plans"] = (read_manifest(cond.plans_dir) or {}).get("config_fingerprint")
    elif cond.conditioning.startswith("planner"):
        hashes["planner"] = planner_hash(cond.planner_dir)  # missing weights: an error follows
    return hashes


# --------------------------------------------------------------------------------------------- command
def train_lm(prepared_dir: str, out_dir: str, model: LMModelConfig = LMModelConfig(),
             conditioning: ConditioningConfig = ConditioningConfig(), train: LMTrainConfig = LMTrainConfig()) -> Path:
    """Finetune a causal LM conditioned on plans (fixed / oracle / planner actions) or on nothing.

    The output folder reloads with ``PlannedLM.from_pretrained(out_dir)``; it is reused when complete
    for the same config and resumed from checkpoints/last.ckpt when interrupted.

    Args:
        prepared_dir: A prepared corpus folder (`planlm prepare`).
        out_dir: The model folder to write.
        model: Which LM to condition (pretrained, random init or a planned-LM folder) and the finetuning mode.
        conditioning: Where the plans come from (none, fixed, oracle, planner_argmax, planner_sampled) and the adapter.
        train: Run knobs (window, batch, optimiser, Lightning trainer).

    Returns:
        The model folder.
    """
    from planlm.data.resources import use_offline_mode_if_no_hub

    use_offline_mode_if_no_hub()
    knobs = TrainerKnobs.of(train)
    check_bf16(knobs.resolved_precision(), knobs.device_type(), "--train.precision")
    prepared = PreparedDataset(prepared_dir)
    out = Path(out_dir)
    splits = [train.train_split, train.val_split]
    for split in splits:
        prepared.split(split)  # one-line error for a missing split
    run_config = _run_config(prepared, model, conditioning, train)
    if prepare_stage_dir(out, run_config, keep_partial=True):
        return out

    init_config = PlannedLM.from_pretrained(model.init_from).config if model.init_from else None
    tokenizer = _check_tokenizer(prepared, model, init_config)
    plans_dir, plans_manifest, plan_arrays, path_counts = _plan_arrays(conditioning, prepared, splits)
    provenance = {"plans_dir": plans_dir,
                  "planner_dir": (plans_manifest or {}).get("planner_dir") or conditioning.planner_dir,
                  "planner_hash": (plans_manifest or {}).get("planner_hash")}

    planned = _build_model(prepared, model, conditioning, tokenizer, provenance, train.train_split, train.seed)
    L.seed_everything(derive_seed(train.seed, "dropout"), verbose=False)  # the same dropout stream in every condition

    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    loaders = {}
    for split_name, shuffle in ((train.train_split, True), (train.val_split, False)):
        split = prepared[split_name]
        windows = article_windows(split, train.context_length, train.stride)
        source = make_action_source(conditioning.conditioning, split, num_paths=conditioning.num_paths,
                                    horizon=conditioning.horizon, fixed_action=conditioning.fixed_action,
                                    plans=plan_arrays.get(split_name) if conditioning.conditioning == "planner_sampled" else None,
                                    argmax_plans=plan_arrays.get(split_name) if conditioning.conditioning == "planner_argmax" else None,
                                    path_counts=path_counts.get(split_name))
        loaders[split_name] = _loader(split, windows, source, train.batch_size, shuffle, train.num_workers,
                                      pad_token_id, train.seed)
    if not len(loaders[train.train_split]):
        raise PlanlmError(f"{prepared.path / train.train_split}: no training window (articles with >= 2 tokens)")
    has_val = len(loaders[train.val_split]) > 0
    val_loaders = [loaders[train.val_split]] if has_val else None
    if has_val and conditioning.conditioning != "none":  # plan usage: the same windows, the plans shuffled
        val_loaders.append(_shuffled_plans_loader(loaders[train.val_split]))

    trainer, best, start = _train(planned, train, out, run_config, loaders[train.train_split], val_loaders)
    if trainer.is_global_zero:
        planned.cpu().save_pretrained(out, tokenizer=tokenizer)
        write_manifest(out, run_config, prepared_dir=str(prepared.path), codebook_hash=prepared.codebook_hash,
                       conditioning=conditioning.conditioning, adapter=conditioning.adapter if
                       conditioning.conditioning != "none" else None, **provenance,
                       plans_manifest=plans_manifest, **_run_results(trainer, best, start),
                       trainable_parameters=sum(p.numel() for p in planned.parameters() if p.requires_grad),
                       rezero_alphas=planned.adapter.alphas() if planned.adapter is not None else None,
                       lm_hash=file_sha256(next((out / "lm").glob("*.safetensors"))))
    return out


def _run_config(prepared: PreparedDataset, model: LMModelConfig, conditioning: ConditioningConfig,
                train: LMTrainConfig) -> dict:
    """The model folder's reuse key: the corpus, the configs and the hashes of the folders the run reads."""
    display_only = ("progress_bar", "num_workers", "resume", "loggers")  # they do not change the trained LM
    return {"prepared": prepared.manifest.get("config_fingerprint"), "codebook_hash": prepared.codebook_hash,
            "model": asdict(model), "conditioning": policy_keyed(asdict(conditioning)),
            "inputs": _input_hashes(model, conditioning),
            "train": {k: v for k, v in asdict(train).items() if k not in display_only}}


def _train(planned: PlannedLM, train: LMTrainConfig, out: Path, run_config: dict, train_loader: DataLoader,
           val_loaders: list | None) -> tuple[L.Trainer, L.pytorch.callbacks.ModelCheckpoint, float]:
    """(trainer, best checkpoint, start time): train through the harness, resuming an interrupted run of the
    same config; ``planned`` ends with the best checkpoint's weights."""
    ckpt_path = resume_checkpoint(out, "checkpoints.fingerprint", run_config, resume=train.resume)
    trainer, best = build_trainer(TrainerKnobs.of(train), out, best_filename="step{step}",
                                  log_folders={"csv": "logs", "tensorboard": "tb"}, has_val=val_loaders is not None)
    module = LightningLM(planned, lr=train.lr, weight_decay=train.weight_decay, warmup_steps=train.warmup_steps,
                         adapter_lr=train.adapter_lr)
    start = time.time()
    if any(p.requires_grad for p in planned.parameters()):
        fit(trainer, module, train_loader, val_loaders, ckpt_path)
    elif val_loaders:  # a frozen pretrained LM without conditioning: nothing to train, its validation loss only
        trainer.validate(module, val_loaders, verbose=False)
    load_best(module, best)
    return trainer, best, start


def _run_results(trainer: L.Trainer, best: L.pytorch.callbacks.ModelCheckpoint, start: float) -> dict:
    """The manifest's account of training: steps, the best checkpoint and its validation loss, plan usage."""
    plan_usage = trainer.callback_metrics.get("val/plan_usage")  # of the last validation, nats per token
    best_score = best.best_model_score if trainer.global_step else trainer.callback_metrics.get("val/loss")
    val_loss = float(best_score) if best_score is not None else None
    return {"global_step": trainer.global_step, "best_checkpoint": best.best_model_path or None, "val_loss": val_loss,
            "last_val_plan_usage": float(plan_usage) if plan_usage is not None else None,
            "val_ppl": math.exp(val_loss) if val_loss is not None else None,
            "train_wall_time_s": time.time() - start}
