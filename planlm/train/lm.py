"""``planlm train-lm``: finetune a causal LM conditioned on plans (section 3.3 of the paper).

``LightningLM`` (``lm_module.py``) holds only the steps and the optimiser; the network is
``planlm.models.planned_lm.PlannedLM``.
The output folder is a ``PlannedLM`` folder (reload it with ``PlannedLM.from_pretrained(out_dir)``; a joint run,
``--train.joint true``, also holds the planner trained with the LM in ``planner/``, ``LightningJointLM``)
plus ``checkpoints/`` (best + last, for resume, under ``checkpoints.fingerprint``), ``logs/`` (CSV) and
``tb/`` (TensorBoard; see --train.loggers), and is complete only once its ``manifest.json`` is written.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from planlm.args import LMRuntime
from planlm.console import is_verbose, note
from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.data.windows import WindowCollator, article_windows
from planlm.errors import PlanlmError
from planlm.files import file_sha256
from planlm.models.adapter import AdapterConfig, AdapterSettings
from planlm.models.planned_lm import JOINT_PLANNER, PlannedLM, PlannedLMConfig, load_causal_lm
from planlm.models.planner import Planner, planner_hash
from planlm.plans.cache import check_cache
from planlm.plans.config import PlanConfig, check_joint_plans, with_source_horizon
from planlm.plans.contexts import ContextSource
from planlm.plans.registry import plan_source
from planlm.seeds import derive_seed
from planlm.speed import compile_options, keep_freed_memory, speed_up_lm
from planlm.stage import StageDir, config_fingerprint
from planlm.train.args import TrainArgs
from planlm.train.harness import build_trainer, checkpoint_step, fit, load_best, resume_checkpoint
from planlm.train.lm_module import MULTIPATH_LR_SCALE, LightningJointLM, LightningLM
from planlm.train.resume import EpochShuffle
from planlm.train.shapes import StaticShapes

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 2, "n_positions": 128}
TRAIN_SPLIT, VALIDATION_SPLIT = "train", "validation"
"""The prepared splits train-lm trains and validates on."""


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
class LMTrainConfig(TrainArgs):
    """Run knobs: the trainer and optimiser group (``TrainArgs``) plus the LM's windows and adapter (the paper's
    defaults: context 128, stride 127, batch 32, lr 1e-4)."""

    context_length: int = 128
    """Tokens per window (windows never cross articles)."""
    stride: int = 127
    """Tokens between window starts (context_length - 1: every token predicted once)."""
    multipath_lr_scale: float = MULTIPATH_LR_SCALE
    """The multipath adapter's PathTransformer and SampleTransformer (behind the ReZero scalars) train at this
    fraction of lr: while the gates are near zero their gradient is mostly noise, which Adam turns into
    full-size steps, so at the full rate a gate opens in some seeds and not in others (see docs/results.md)."""
    joint: bool = False
    """Finetune the planner with the LM (planner kinds; beyond the paper, after Cornille et al.'s end-to-end
    follow-up), so that the LM's loss teaches the planner which plans help it. The planner runs on each batch's
    boundaries (no plan cache), the adapter reads its step distributions in expectation (set plans.expectation false
    for the straight-through estimator: the drawn action forward, the expectation's gradient backward), and the
    planner keeps its own action loss (planner_loss_weight) at its own rate (planner_lr). The finetuned planner is
    saved in the model folder (planner/) and evaluation, generation and adherence run it."""
    planner_lr: float | None = None
    """Joint training (joint): the planner's learning rate (None: lr). The planner arrives trained; a lower
    rate keeps it near the planner it was, a higher one lets the LM's loss move it further."""
    planner_loss_weight: float = 1.0
    """Joint training (joint): the weight of the planner's own action loss (cross-entropy on the true actions,
    its training objective) added to the LM's loss; it keeps the planner a planner of the corpus's actions while the
    LM's loss teaches it which plans help. 0: the LM's loss alone."""
    resume: bool = True
    """Resume from checkpoints/last.ckpt of an interrupted run with the same config."""

    DISPLAY_ONLY: ClassVar[tuple[str, ...]] = ("num_workers", "resume", "loggers")
    COMMAND: ClassVar[str] = "train-lm"

    def __post_init__(self):
        super().__post_init__()
        if self.context_length < 2:
            raise PlanlmError(f"--train.context_length must be >= 2 (got {self.context_length})")
        if not 1 <= self.stride <= self.context_length - 1:
            raise PlanlmError(f"--train.stride {self.stride} must be in [1, context_length - 1]")
        if self.multipath_lr_scale <= 0:
            raise PlanlmError(f"--train.multipath_lr_scale must be > 0 (got {self.multipath_lr_scale})")
        if self.planner_lr is not None and self.planner_lr <= 0:
            raise PlanlmError(f"--train.planner_lr must be > 0 (got {self.planner_lr})")
        if self.planner_loss_weight < 0:
            raise PlanlmError(f"--train.planner_loss_weight must be >= 0 (got {self.planner_loss_weight})")

    def check_planner_knobs(self) -> None:
        """The planner's knobs are set only for a joint run (they would change the reuse key and nothing else)."""
        if self.joint:
            return
        for knob in ("planner_lr", "planner_loss_weight"):
            if getattr(self, knob) != getattr(LMTrainConfig, knob):
                raise PlanlmError(f"--train.{knob} trains the planner with the LM: set --train.joint true or drop it")


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


def _training_plans(plans: PlanConfig, prepared: PreparedDataset, splits: list[str],
                    joint: bool) -> tuple[PlanConfig, dict | None]:
    """The resolved config ``plans`` with its plan cache (sampled now, or reused, from the planner when none is
    given) and the cache's manifest, after checking that the cache fits it and the corpus; other kinds, and joint training (the
    planner runs in the step), need no cache."""
    if not plans.plan_kind.uses_planner or joint:
        return plans, None
    if plans.plans_dir is None:
        from planlm.plans.sampling import sample_plans

        cache = sample_plans(prepared_dir=str(prepared.path), plans=plans, splits=splits)
        plans = replace(plans, plans_dir=str(cache))
    manifest = check_cache(plans, prepared)
    return replace(plans, planner_dir=manifest.get("planner_dir") or plans.planner_dir), manifest


def _joint_planner(plans: PlanConfig, prepared: PreparedDataset) -> Planner:
    """The planner a joint run trains with the LM, after checking that it plans over this corpus's actions and
    reads its sentence embeddings (one-line errors before training starts)."""
    planner = Planner.for_corpus(plans.planner_dir, prepared)
    if planner.config.finetune_encoder:
        raise PlanlmError(f"{plans.planner_dir}: the planner finetunes its own sentence encoder; joint training reads "
                          f"the prepared embeddings: give a planner trained with --model.finetune_encoder false")
    return planner


def _loaders(prepared: PreparedDataset, plans: PlanConfig, train: LMTrainConfig, pad_token_id: int,
             planner: Planner | None = None) -> tuple[DataLoader, list[DataLoader] | None]:
    """(training loader, validation loaders): the windows of each split with the plans of ``plans`` (joint training:
    with what ``planner`` reads at their boundaries, ``ContextSource``); with plans, a second validation loader holds
    the same windows with the plans shuffled (plan usage)."""
    loaders = {}
    for split_name, shuffle in ((TRAIN_SPLIT, True), (VALIDATION_SPLIT, False)):
        split = prepared[split_name]
        windows = article_windows(split, train.context_length, train.stride)
        source = plan_source(plans, prepared, split) if planner is None else \
            ContextSource(split, planner.config.max_sentences, planner.config.horizon, plans.num_paths, plans.horizon)
        loaders[split_name] = _loader(split, windows, source, train.batch_size, shuffle, train.num_workers,
                                      pad_token_id, train.seed)
    if not len(loaders[TRAIN_SPLIT]):
        raise PlanlmError(f"{prepared.path / TRAIN_SPLIT}: no training window (articles with >= 2 tokens)")
    if not len(loaders[VALIDATION_SPLIT]):
        return loaders[TRAIN_SPLIT], None
    val_loaders = [loaders[VALIDATION_SPLIT]]
    if plans.has_plans:  # plan usage: the same windows, the plans shuffled
        val_loaders.append(_shuffled_plans_loader(loaders[VALIDATION_SPLIT]))
    return loaders[TRAIN_SPLIT], val_loaders


def _loader(split: PreparedSplit, windows: np.ndarray, source, batch_size: int, shuffle: bool, num_workers: int,
            pad_token_id: int, seed: int) -> DataLoader:
    sampler = data_order(windows, seed, batch_size) if shuffle else None
    return DataLoader(windows, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      collate_fn=WindowCollator(split, source, pad_token_id), drop_last=False)


def data_order(windows: np.ndarray, seed: int, batch_size: int) -> EpochShuffle:
    """The sampler that shuffles the training windows: each epoch's order from (a stream of the run seed of
    its own, epoch) alone, so every condition of a run (whatever its adapter and its number of parameters)
    sees the same windows in the same order, and a resumed run the batches the interrupted one would have."""
    return EpochShuffle(windows, derive_seed(seed, "data_order"), batch_size)


def _shuffled_plans_loader(loader: DataLoader) -> DataLoader:
    """The validation loader with the plans shuffled across the split's sentences (plan usage)."""
    from planlm.evaluate.plan_usage import plan_permutation
    from planlm.plans.sources import ShuffledPlans

    collator = loader.collate_fn
    permutation = plan_permutation(collator.split.num_sentences)
    shuffled = WindowCollator(collator.split, ShuffledPlans(collator.source, permutation), collator.pad_token_id)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, shuffle=False, num_workers=loader.num_workers,
                      collate_fn=shuffled)


def _build_model(prepared: PreparedDataset, model: LMModelConfig, plans: PlanConfig, adapter: AdapterSettings,
                 tokenizer, source_planner_hash: str | None, train_split_name: str, seed: int) -> PlannedLM:
    """The LM (a random init drawn from ``seed``, the same for every condition) plus its adapter, drawn
    from a stream of its own so that it shifts nothing else."""
    L.seed_everything(seed, verbose=False)
    init = PlannedLM.from_pretrained(model.init_from) if model.init_from else None
    if init is not None and init.config.codebook_hash not in (None, prepared.codebook_hash) and plans.has_plans:
        raise PlanlmError(f"{Path(model.init_from) / 'planned_lm.json'}: trained on another codebook than "
                          f"{prepared.path}; start from a model of this corpus or from a plain LM")
    lm = init.lm if init is not None else load_causal_lm(model.name_or_path, model.model_config, len(tokenizer),
                                                             tokenizer.eos_token_id)
    _check_fits(lm, prepared, prepared[train_split_name], plans)
    adapter_config = None
    if plans.has_plans:
        adapter_config = AdapterConfig.of(adapter, num_actions=prepared.num_actions,
                                          codebook_width=prepared.embedding_dim,
                                          hidden_size=lm.get_input_embeddings().embedding_dim, horizon=plans.horizon)
    config = PlannedLMConfig(
        plans=plans, adapter=adapter_config, tokenizer=prepared.tokenizer_name, num_actions=prepared.num_actions,
        codebook_hash=prepared.codebook_hash, planner_hash=source_planner_hash,
        base_model=model.name_or_path or (init.config.base_model if init else None),
        base_model_config=None if model.name_or_path else (init.config.base_model_config if init else model.model_config))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "adapter"))
        planned = PlannedLM(config, lm, prepared.codebook)
    planned.plan_folders = {"planner_dir": plans.planner_dir, "plans_dir": plans.plans_dir}
    if init is not None and init.adapter is not None and planned.adapter is not None \
            and asdict(init.config.adapter) == asdict(adapter_config):
        planned.adapter.load_state_dict(init.adapter.state_dict())
    if model.finetune == "frozen" and planned.adapter is None and lm_is_pretrained(model):
        planned.lm.requires_grad_(False)  # "none" on a frozen pretrained base: the base itself, validated only
        planned.config.finetune = "frozen"
    else:
        planned.apply_finetune(model.finetune, model.lora_rank, model.lora_alpha, model.lora_dropout,
                               model.lora_target_modules)
    return planned.train()  # from_pretrained (init_from) leaves the modules in eval mode: no dropout


def _check_fits(lm, prepared: PreparedDataset, train_split: PreparedSplit, plans: PlanConfig) -> None:
    """The corpus' token ids fit the LM's embeddings, and a fixed action is one of the corpus' actions."""
    max_id = int(np.max(train_split.input_ids)) if train_split.num_tokens else 0
    if max_id >= lm.get_input_embeddings().num_embeddings:
        raise PlanlmError(f"{prepared.path}: token id {max_id} does not fit the LM's "
                          f"{lm.get_input_embeddings().num_embeddings} embeddings; use an LM of tokenizer "
                          f"{prepared.tokenizer_name!r}")
    plans.plan_kind.check_actions(plans, prepared.num_actions, str(prepared.path))


def lm_is_pretrained(model: LMModelConfig) -> bool:
    """Whether the LM starts from trained weights (a pretrained name or GGUF file, or a planned-LM folder)."""
    return bool(model.name_or_path or model.init_from)


def _input_hashes(model: LMModelConfig, plans: PlanConfig) -> dict:
    """What the folders a run reads hold, not only their names: the weights of the planner that makes the
    plans (or the plan cache's key) and of the LM it starts from, so that retraining either into the same
    folder retrains this LM instead of reusing it."""
    from planlm.evaluate.loading import model_fingerprint

    hashes = {"init_from": model_fingerprint(model.init_from) if model.init_from else None}
    if plans.plans_dir:  # a resolved config names a plan cache or a planner only for a planner kind
        hashes["plans"] = config_fingerprint(plans.plans_dir)
    elif plans.planner_dir:
        hashes["planner"] = planner_hash(plans.planner_dir)  # missing weights: an error follows
    return hashes


# --------------------------------------------------------------------------------------------- command
def train_lm(prepared_dir: str, out_dir: str, model: LMModelConfig = LMModelConfig(),
             plans: PlanConfig = PlanConfig(), adapter: AdapterSettings = AdapterSettings(),
             train: LMTrainConfig = LMTrainConfig(), runtime: LMRuntime = LMRuntime()) -> Path:
    """Finetune a causal LM conditioned on plans (fixed / oracle / planner actions) or on nothing.

    The output folder reloads with ``PlannedLM.from_pretrained(out_dir)``; it is reused when complete
    for the same config and resumed from checkpoints/last.ckpt when interrupted.

    Args:
        prepared_dir: A prepared corpus folder (`planlm prepare`).
        out_dir: The model folder to write.
        model: Which LM to condition (pretrained, random init or a planned-LM folder) and the finetuning mode.
        plans: Where the plans come from (kind: none, fixed, oracle, planner_argmax, planner_sampled), K, T, tau,
            seed, planner or plan cache, path policy, expectation; unset fields take the defaults (K = 1, tau = 1;
            T: the horizon the planner was trained with, or the plan cache's, and 1 for plans without a planner).
            The adapter is built for this T.
        adapter: How the adapter folds K paths into one vector (kind: project_avg, multipath, a registered adapter or
            an Adapter class's import path, my_package.module:ClassName; the fields of the kind's config).
        train: Run knobs (window, batch, optimiser, Lightning trainer; joint: the planner trains with the LM).
        runtime: The accelerator and precision (runtime.precision bf16: bf16 autocast), torch.compile and the chunked
            loss (the same model, trained faster; not part of the reuse key).

    Returns:
        The model folder.
    """
    from planlm.data.resources import use_offline_mode_if_no_hub

    use_offline_mode_if_no_hub()
    if not isinstance(runtime, LMRuntime):  # a plain Runtime (Python callers): the speed knobs at their defaults
        runtime = LMRuntime(device=runtime.device, precision=runtime.precision)
    runtime.check_training_precision("train-lm")
    asked, plans = plans, with_source_horizon(plans).resolve()  # T unset: the planner's (or the plan cache's)
    train.check_planner_knobs()
    if train.joint:
        check_joint_plans(plans)
        if asked.expectation is None:  # joint training differentiates the expected embedding
            plans = with_source_horizon(replace(asked, expectation=True)).resolve()
    plans.check_source()
    prepared = PreparedDataset(prepared_dir)
    splits = [TRAIN_SPLIT, VALIDATION_SPLIT]
    for split in splits:
        prepared.split(split)  # one-line error for a missing split
    with StageDir(out_dir, _run_config(prepared, model, plans, adapter, train, runtime), keep_partial=True) as stage:
        if not stage.reused:
            _train_into(stage, prepared, model, plans, adapter, train, runtime, splits)
    return stage.path


def _train_into(stage: StageDir, prepared: PreparedDataset, model: LMModelConfig, plans: PlanConfig,
                adapter: AdapterSettings, train: LMTrainConfig, runtime: LMRuntime, splits: list[str]) -> None:
    """Train the planned LM into ``stage`` (resuming its last checkpoint of the same key) and, on rank 0, write the
    model folder and, last, the manifest."""
    began = time.perf_counter()
    out = stage.path
    init_config = PlannedLM.from_pretrained(model.init_from).config if model.init_from else None
    tokenizer = _check_tokenizer(prepared, model, init_config)
    plans, plans_manifest = _training_plans(plans, prepared, splits, train.joint)
    planner = _joint_planner(plans, prepared) if train.joint else None
    source_planner_hash = (planner_hash(plans.planner_dir) if train.joint
                           else (plans_manifest or {}).get("planner_hash"))

    planned = _build_model(prepared, model, plans, adapter, tokenizer, source_planner_hash, TRAIN_SPLIT, train.seed)
    keep_freed_memory()
    speed_up_lm(planned, runtime, "train-lm")
    L.seed_everything(derive_seed(train.seed, "dropout"), verbose=False)  # the same dropout stream in every condition

    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    train_loader, val_loaders = _loaders(prepared, plans, train, pad_token_id, planner)
    trainer, best, start, first_step, times = _train(planned, train, runtime, out, stage.key, train_loader,
                                                     val_loaders, plans, planner, setup=time.perf_counter() - began)
    if trainer.is_global_zero:
        results = _run_results(trainer, best, start, first_step)
        if planner is not None:  # beside the LM, before its card: evaluation finds it there (recorded_plan_folders)
            planner.cpu().save_pretrained(out / JOINT_PLANNER)
        saving = time.perf_counter()
        planned.cpu().save_pretrained(out, tokenizer=tokenizer, training=_card_training(prepared, results))
        results["call_time_s"] = call_times(times, save=time.perf_counter() - saving,
                                            call=time.perf_counter() - began)
        if is_verbose():
            note(f"train-lm: {describe_call_times(results['call_time_s'])}")
        stage.finish(prepared_dir=str(prepared.path), codebook_hash=prepared.codebook_hash,
                     conditioning=str(plans.kind), adapter=adapter.kind if plans.has_plans else None,
                     plans_dir=plans.plans_dir, planner_dir=plans.planner_dir, planner_hash=source_planner_hash,
                     **({"joint_planner": JOINT_PLANNER} if planner is not None else {}),
                     plans_manifest=plans_manifest, **results,
                     trainable_parameters=sum(p.numel() for p in planned.parameters() if p.requires_grad),
                     rezero_alphas=planned.adapter.alphas() if planned.adapter is not None else None,
                     lm_hash=file_sha256(next((out / "lm").glob("*.safetensors"))))


def _run_config(prepared: PreparedDataset, model: LMModelConfig, plans: PlanConfig, adapter: AdapterSettings,
                train: LMTrainConfig, runtime: LMRuntime) -> dict:
    """The model folder's reuse key: the corpus, the configs and the hashes of the folders the run reads."""
    return {"prepared": prepared.manifest.get("config_fingerprint"), "codebook_hash": prepared.codebook_hash,
            "model": asdict(model), "plans": plans.cache_key(), "adapter": adapter.reuse_key(),
            "inputs": _input_hashes(model, plans),
            "train": train.reuse_key(runtime)}


def _train(planned: PlannedLM, train: LMTrainConfig, runtime: LMRuntime, out: Path, run_config: dict,
           train_loader: DataLoader, val_loaders: list | None, plans: PlanConfig,
           planner: Planner | None = None,
           setup: float = 0.0) -> tuple[L.Trainer, L.pytorch.callbacks.ModelCheckpoint, float, int, dict]:
    """(trainer, best checkpoint, start time, first step, seconds by part: ``call_times``' input): train through
    the harness, resuming an interrupted run of the same config at its last checkpoint's step (else step 0);
    ``planned`` (and a joint run's ``planner``) end with the best checkpoint's weights (read back only when training
    went on after it was written). ``setup``: the seconds the call spent before this."""
    began = time.perf_counter()
    ckpt_path = resume_checkpoint(out, "checkpoints.fingerprint", run_config, resume=train.resume)
    first_step = checkpoint_step(ckpt_path) if ckpt_path else 0
    trainer, best = build_trainer(train, runtime, out, best_filename="step{step}",
                                  log_folders={"csv": "logs", "tensorboard": "tb"}, has_val=val_loaders is not None)
    knobs = dict(lr=train.lr, weight_decay=train.weight_decay, warmup_steps=train.warmup_steps,
                 multipath_lr_scale=train.multipath_lr_scale, **step_shapes(train, runtime))
    if planner is None:
        module = LightningLM(planned, **knobs)
    else:
        module = LightningJointLM(planned, planner, plans, planner_lr=train.planner_lr,
                                  action_loss_weight=train.planner_loss_weight, **knobs)
    start = time.time()
    setup += time.perf_counter() - began
    clock = None
    if any(p.requires_grad for p in planned.parameters()):
        with warnings.catch_warnings():  # a joint run's planner trains in eval mode, by design (LightningJointLM)
            warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training.*")
            clock = fit(trainer, module, train_loader, val_loaders, ckpt_path)
    elif val_loaders:  # a frozen pretrained LM without conditioning: nothing to train, its validation loss only
        trainer.validate(module, val_loaders, verbose=False)
    reloading = time.perf_counter()
    reloaded = load_best(module, best, clock)
    times = {"setup": setup, "best_reload": time.perf_counter() - reloading if reloaded else 0.0}
    if clock is not None:
        times.update(clock.seconds, steps_count=clock.steps)
    return trainer, best, start, first_step, times


def step_shapes(train: LMTrainConfig, runtime: LMRuntime) -> dict:
    """``LightningLM``'s static shapes and CUDA-graph steps for a compiled run (``runtime.compile``); eager: none,
    the batches as they come."""
    if not runtime.compile:
        return {"static_shapes": None, "cuda_graphs": False}
    return {"static_shapes": StaticShapes(train.batch_size, train.context_length),
            "cuda_graphs": compile_options(runtime).get("mode") == "reduce-overhead"}


def call_times(times: dict, save: float, call: float) -> dict:
    """Where a train-lm call's wall seconds went, for its manifest: setup (the model, the loaders, the trainer), the
    fit's training steps, its validation, its checkpoint writes and the rest of the fit, the best checkpoint's
    reload, the model folder's save, and the share of the call outside its training steps."""
    parts = {key: round(times.get(key, 0.0), 3) for key in ("setup", "steps", "validation", "checkpoints")}
    parts["fit_other"] = round(max(0.0, times.get("fit", 0.0) - sum(times.get(key, 0.0) for key in
                                                                    ("steps", "validation", "checkpoints"))), 3)
    parts.update(best_reload=round(times.get("best_reload", 0.0), 3), save=round(save, 3), call=round(call, 3),
                 train_steps=int(times.get("steps_count", 0)))
    parts["outside_steps_share"] = round(1 - parts["steps"] / parts["call"], 4) if parts["call"] > 0 else None
    return parts


def describe_call_times(parts: dict) -> str:
    """One line of ``call_times``."""
    return (f"{parts['call']:.1f} s: {parts['train_steps']} training steps {parts['steps']:.1f} s, validation "
            f"{parts['validation']:.1f} s, checkpoints {parts['checkpoints']:.1f} s, rest of the fit "
            f"{parts['fit_other']:.1f} s, setup {parts['setup']:.1f} s, best-checkpoint reload "
            f"{parts['best_reload']:.1f} s, saving {parts['save']:.1f} s "
            f"({100 * (parts['outside_steps_share'] or 0):.0f}% outside the steps)")


def _card_training(prepared: PreparedDataset, results: dict) -> dict:
    """What the model card says of the corpus and the run (``planlm.models.card``)."""
    corpus = prepared.manifest.get("config", {}).get("corpus", {})
    return {"prepared_dir": str(prepared.path), "corpus_fingerprint": prepared.manifest.get("config_fingerprint"),
            "corpus_source": corpus.get("source"), "encoder": prepared.encoder_name,
            "sentence_splitter": prepared.sentence_splitter, "global_step": results["global_step"],
            "val_loss": results["val_loss"], "val_ppl": results["val_ppl"]}


def _run_results(trainer: L.Trainer, best: L.pytorch.callbacks.ModelCheckpoint, start: float, first_step: int) -> dict:
    """The manifest's account of training: steps, the best checkpoint and its validation loss, plan usage, and the
    wall time of this start, which trained the steps from ``resumed_from_step`` (0 unless it resumed a checkpoint)."""
    plan_usage = trainer.callback_metrics.get("val/plan_usage")  # of the last validation, nats per token
    best_score = best.best_model_score if trainer.global_step else trainer.callback_metrics.get("val/loss")
    val_loss = float(best_score) if best_score is not None else None
    return {"global_step": trainer.global_step, "best_checkpoint": best.best_model_path or None, "val_loss": val_loss,
            "last_val_plan_usage": float(plan_usage) if plan_usage is not None else None,
            "val_ppl": math.exp(val_loss) if val_loss is not None else None,
            "train_wall_time_s": time.time() - start, "resumed_from_step": first_step}
