"""PlannedLM: any Hugging Face causal LM conditioned on plans, by extension (section 3.3).

Letters: B batch (windows), L tokens, N unique sentences of the batch (one plan each), K paths,
T horizon, D the LM's width.

The plan vector c_i of sentence i (one adapter call per *unique* sentence, N of them) is added to
the token embedding of every token whose ``plan_index`` points at i, and the sum enters the
unchanged HF model through ``inputs_embeds``. Which sentence conditions a token is the data's
business (``token_plan_sentence``, the alignment of ``planlm.data.artifacts``); here it is ``plan_index (B, L)``:
an index into the N plans, or -1 for "no conditioning" (padding, or the ``none`` kind).

A saved folder::

    planned_lm.json          PlannedLMConfig (the plans' settings, adapter shape, hashes of the plans' sources) and
                             planlm's format_version (``planlm.stage.integrity.FORMAT_VERSION``)
    lm/                      the HF model's save_pretrained (safetensors; LoRA merged in)
    adapter.safetensors      the adapter's weights (absent for plans kind "none")
    codebook.safetensors     {"centroids": (A, E)} the actions the adapter was trained on
    tokenizer/               the tokenizer of the prepared corpus
    planner/                 joint training only (``train.joint``): the planner trained with the LM, a planner folder;
                             the model's evaluations, generation and adherence run it
    README.md                the model card; its training block names the folders the plans came from
                             (``PlannedLM.plan_folders``: run paths, never in the config)
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from planlm.errors import PlanlmError
from planlm.files import honour_umask, save_safetensors
from planlm.jsonio import to_jsonable, write_json
from planlm.models import planner
from planlm.models.adapter import AdapterConfig, build_adapter, gather_rows
from planlm.models.card import evaluation_entry, planned_lm_card, read_planlm_block, write_card
from planlm.models.lm_loss import linear_cross_entropy, split_lm_head
from planlm.plugins import PluginImportError, UnknownKind
from planlm.stage.integrity import FORMAT_KEY, with_format

# The KV cache's name in the LM's forward and output: transformers renamed ``past_key_values`` to ``cache`` and drops
# the old name in 5.40; older releases know only the old one.
CACHE_NAME = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def output_cache(output):
    """The KV cache an LM's forward returned (``use_cache=True``), under either of transformers' names."""
    return getattr(output, CACHE_NAME)

Finetune = Literal["full", "frozen", "lora"]
PLAN_FOLDERS = ("planner_dir", "plans_dir")  # where a run's plans came from: the run's paths, not the model's
JOINT_PLANNER = "planner"  # the subfolder holding the planner trained with the LM (train.joint)


@dataclass
class PlannedLMConfig:
    plans: dict = field(default_factory=dict)
    """The plans the model was trained with: the fields of a ``planlm.plans.config.PlanConfig`` (kind, num_paths,
    horizon, temperature, ...) but the folders they came from (``PlannedLM.plan_folders``); evaluation inherits what it does
    not override (``planlm.plans.config.trained_plans``)."""
    adapter: AdapterConfig | None = None
    """Shape of the adapter (None for plans kind "none")."""
    tokenizer: str = "gpt2"
    """Tokenizer name of the prepared corpus (also saved under tokenizer/)."""
    num_actions: int = 0
    """A of the codebook the adapter was trained on."""
    codebook_hash: str | None = None
    """sha256 of the prepared codebook.safetensors."""
    planner_hash: str | None = None
    """sha256 of the model.safetensors of the planner that produced the training plans."""
    base_model: str | None = None
    """Hub name or folder of the pretrained LM (None: random init from base_model_config)."""
    base_model_config: dict | None = None
    """Config dict of a randomly initialised LM (e.g. {"model_type": "gpt2", "n_layer": 2, ...})."""
    finetune: Finetune = "full"
    """How the LM was finetuned: full, frozen (only the conditioning trained) or lora (merged on save)."""

    def __post_init__(self):
        if isinstance(self.adapter, dict):
            self.adapter = AdapterConfig(**self.adapter)
        self.plans = {key: value for key, value in to_jsonable(self.plans).items() if key not in PLAN_FOLDERS}
        self.plans["kind"] = self.plans.get("kind") or "none"  # a plain LM: no plans, the default kind

    @classmethod
    def from_dict(cls, values: dict) -> PlannedLMConfig:
        """From planned_lm.json (its format checked by the loader)."""
        return cls(**{key: value for key, value in values.items() if key != FORMAT_KEY})


def load_causal_lm(name_or_path: str | None, model_config: dict | None = None, vocab_size: int | None = None,
                   eos_token_id: int | None = None):
    """An HF ``AutoModelForCausalLM``: pretrained (hub name, local folder, ``*.gguf`` file or the offline
    ``smollm2-135m``; see ``planlm.pretrained``) or randomly initialised.

    ``model_config`` (used when ``name_or_path`` is None) is an ``AutoConfig.for_model`` dict such as
    ``{"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 2, "n_positions": 128}``; its
    vocabulary defaults to ``vocab_size`` and its bos / eos ids to ``eos_token_id``. A pretrained model whose vocabulary is smaller than
    ``vocab_size`` is refused (its embedding table cannot hold the corpus' token ids)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from planlm.hub import hub_available
    from planlm.pretrained import resolve_pretrained

    if name_or_path:
        path = resolve_pretrained(name_or_path)  # a GGUF file: its exported safetensors folder
        try:
            lm = AutoModelForCausalLM.from_pretrained(path, local_files_only=not hub_available())
        except Exception as e:
            raise PlanlmError(
                f"causal LM {name_or_path!r} could not be loaded ({type(e).__name__}); give a local model folder, "
                f"a hub name reachable from here, or set name_or_path: null and model_config for a random init") from e
    elif model_config:
        model_config = dict(model_config)
        model_type = model_config.pop("model_type", None)
        if model_type is None:
            raise PlanlmError(f"model_config {model_config} needs a model_type (e.g. gpt2, llama, gpt_neox, opt)")
        if vocab_size is not None:
            model_config.setdefault("vocab_size", vocab_size)
        if eos_token_id is not None:  # GPT-2's defaults (50256) lie outside a smaller corpus vocabulary
            model_config.setdefault("bos_token_id", eos_token_id)
            model_config.setdefault("eos_token_id", eos_token_id)
        try:
            config = AutoConfig.for_model(model_type, **model_config)
        except Exception as e:
            raise PlanlmError(f"model_config: cannot build a {model_type!r} config ({e}); fix the keys") from e
        lm = AutoModelForCausalLM.from_config(config)
    else:
        raise PlanlmError("no LM given: set model.name_or_path (pretrained) or model.model_config (random init)")
    if vocab_size is not None and lm.get_input_embeddings().num_embeddings < vocab_size:
        raise PlanlmError(
            f"LM {name_or_path or model_config} has {lm.get_input_embeddings().num_embeddings} token embeddings but "
            f"the corpus tokenizer has {vocab_size}; use an LM trained with the corpus tokenizer")
    return lm


class PlannedLM(nn.Module):
    """An HF causal LM plus an adapter that adds plan vectors to its token embeddings."""

    def __init__(self, config: PlannedLMConfig, lm: nn.Module, codebook: Tensor | None = None):
        super().__init__()
        self.config = config
        self.lm = lm
        if codebook is not None:
            self.register_buffer("codebook", codebook.detach().float().clone(), persistent=False)  # (A, E)
        else:
            self.codebook = None
        self.adapter = build_adapter(config.adapter, codebook) if config.adapter is not None else None
        self.plan_folders: dict[str, str] = {}
        """The folders the training plans came from (planner_dir, plans_dir): the run's paths, kept in the model card
        (the training block), not in the config; an evaluation takes its default planner from them."""
        self.loss_chunk_size = 0
        """With labels, compute the loss this many tokens at a time without the logits (``planlm.models.lm_loss``;
        0: the LM's own loss on all the logits). A run setting (``Runtime.loss_chunk_size``), not part of the saved
        config."""
        self.compile_loss = False
        """Training chunks of that loss through the compiled ``softmax_grad`` (``Runtime.compile_loss``)."""
        self.static_shapes = False
        """That loss over every token, the ignored ones masked (no shape that depends on the data; set with
        ``Runtime.compile``)."""
        self.folder: Path | None = None  # where it was saved to or loaded from (what push_to_hub uploads)

    @property
    def hidden_size(self) -> int:
        return self.lm.get_input_embeddings().embedding_dim

    def plan_vectors(self, action_paths: Tensor, path_mask: Tensor | None = None,
                     action_probs: Tensor | None = None) -> Tensor:
        """(N, K, T) long [+ (N, K, T) bool] -> plan_embeds (N, D); in expectation action_paths and action_probs
        are (N, K, T, M): each step's top actions and their probabilities (``planlm.plans.sources.Plans``)."""
        if self.adapter is None:
            raise PlanlmError("this model was trained without plans (plans kind none); it has no adapter")
        return self.adapter(action_paths, path_mask, action_probs)

    def token_plan_embeds(self, plan_vectors: Tensor, plan_index: Tensor) -> Tensor:
        """Gather (N, D) plan vectors onto tokens: plan_index (B, L) in [-1, N) -> (B, L, D), zeros at -1."""
        padded = torch.cat([plan_vectors.new_zeros(1, plan_vectors.shape[-1]), plan_vectors])  # (N+1, D)
        return gather_rows(padded, plan_index + 1)  # (B, L, D)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
                action_paths: Tensor | None = None, path_mask: Tensor | None = None,
                plan_index: Tensor | None = None, plan_embeds: Tensor | None = None,
                cache=None, use_cache: bool = False, action_probs: Tensor | None = None, **lm_kwargs):
        """Causal-LM forward; ``labels`` are shifted inside (HF convention, -100 ignored).

        input_ids (B, L); action_paths (N, K, T) + path_mask (N, K, T) + plan_index (B, L) (in expectation
        also action_probs, see ``plan_vectors``), or plan_embeds (B, L, D) precomputed. With neither, this is
        exactly the bare LM. ``cache``: the KV cache of the positions before input_ids, as the output of a call
        with ``use_cache=True`` returns it (``output_cache``)."""
        if plan_embeds is None and action_paths is not None:
            if plan_index is None:
                raise ValueError("action_paths need plan_index (B, L): which plan conditions each token")
            plan_embeds = self.token_plan_embeds(self.plan_vectors(action_paths, path_mask, action_probs), plan_index)
        inputs = {"input_ids": input_ids} if plan_embeds is None else {"inputs_embeds": self._embed(input_ids, plan_embeds)}
        split = split_lm_head(self.lm) if self.loss_chunk_size and labels is not None and not use_cache else None
        if split is not None:  # the loss without the logits
            body, head = split
            hidden = body(attention_mask=attention_mask, **inputs, **lm_kwargs).last_hidden_state  # (B, L, D)
            loss = linear_cross_entropy(hidden[:, :-1].flatten(0, 1), head.weight, labels[:, 1:].flatten(),
                                        self.loss_chunk_size, compiled=self.compile_loss, static=self.static_shapes)
            return CausalLMOutputWithPast(loss=loss)
        if cache is not None:
            lm_kwargs[CACHE_NAME] = cache
        return self.lm(attention_mask=attention_mask, labels=labels, use_cache=use_cache, **inputs, **lm_kwargs)

    def _embed(self, input_ids: Tensor, plan_embeds: Tensor) -> Tensor:
        """Token embeddings plus plan vectors: input_ids (B, L), plan_embeds (B, L, D) -> inputs_embeds (B, L, D)."""
        token_embeds = self.lm.get_input_embeddings()(input_ids)  # (B, L, D)
        return token_embeds + plan_embeds.to(token_embeds.dtype)  # (B, L, D)

    def token_nll(self, input_ids: Tensor, targets: Tensor, plan_embeds: Tensor | None = None) -> Tensor:
        """NLL of ``targets (B, P)``, the tokens that follow the last P positions of ``input_ids (B, L)`` ->
        (B, P) fp32; only those P positions are projected onto the vocabulary (chunked with loss_chunk_size)."""
        num_scored = targets.shape[1]
        split = split_lm_head(self.lm) if self.loss_chunk_size else None
        if split is None:
            logits = self(input_ids=input_ids, plan_embeds=plan_embeds, logits_to_keep=num_scored).logits  # (B, P, V)
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
        body, head = split
        inputs = {"input_ids": input_ids} if plan_embeds is None else {"inputs_embeds": self._embed(input_ids, plan_embeds)}
        hidden = body(**inputs).last_hidden_state[:, -num_scored:]  # (B, P, D)
        nll = linear_cross_entropy(hidden.flatten(0, 1), head.weight, targets.flatten(), self.loss_chunk_size,
                                   reduction="none")  # (B*P,)
        return nll.view_as(targets)

    # ----------------------------------------------------------------------------- finetuning modes
    def apply_finetune(self, mode: Finetune, lora_rank: int = 8, lora_alpha: int = 16, lora_dropout: float = 0.0,
                       lora_target_modules: list[str] | None = None) -> None:
        """full: train everything; frozen: only the adapter trains; lora: peft LoRA on the LM + the adapter."""
        if mode == "full":
            self.lm.requires_grad_(True)
        elif mode == "frozen":
            if self.adapter is None:
                raise PlanlmError("finetune: frozen with plans kind none leaves nothing to train; "
                                  "choose full or lora, or a plans kind")
            self.lm.requires_grad_(False)
        elif mode == "lora":
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                              target_modules=lora_target_modules, task_type="CAUSAL_LM")
            try:
                self.lm = get_peft_model(self.lm, lora)
            except ValueError as e:
                raise PlanlmError(f"finetune: lora: {e}; set model.lora_target_modules") from e
        else:
            raise PlanlmError(f"--finetune {mode!r}: choose full, frozen or lora")
        self.config.finetune = mode

    def base_lm(self) -> nn.Module:
        """The plain HF model (LoRA weights merged into a copy when the LM is a peft model)."""
        from peft import PeftModel

        if isinstance(self.lm, PeftModel):
            return copy.deepcopy(self.lm).merge_and_unload()
        return self.lm

    # ----------------------------------------------------------------------------- save / load
    def save_pretrained(self, folder: str | Path, tokenizer=None, training: dict | None = None) -> Path:
        """Weights, config and tokenizer, then, last, the model card (README.md; ``training``: corpus and run facts
        for it). A folder with a card is complete (``planlm.models.card``)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.base_lm().save_pretrained(folder / "lm", safe_serialization=True)
        honour_umask(folder / "lm")  # transformers writes model.safetensors 0600
        if self.adapter is not None:
            state = {name: t.detach().contiguous().cpu() for name, t in self.adapter.state_dict().items()}
            save_safetensors(state, folder / "adapter.safetensors")
        if self.codebook is not None:
            save_safetensors({"centroids": self.codebook.detach().cpu().contiguous()}, folder / "codebook.safetensors")
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder / "tokenizer"))
        write_json(folder / "planned_lm.json", with_format(to_jsonable(self.config)))
        write_card(folder, planned_lm_card(self.config, {**self.plan_folders, **(training or {})}))
        self.folder = folder
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path, map_location: str | torch.device = "cpu") -> PlannedLM:
        """From a saved folder or a Hub repo id (``planlm.hub.local_folder``: the local cache when offline)."""
        from transformers import AutoModelForCausalLM

        from planlm.hub import local_folder
        from planlm.stage.integrity import check_format, fix_for, load_json, load_safetensors, reading, stage_manifest

        folder = local_folder(folder, "planned LM")
        config_path = folder / "planned_lm.json"
        if not config_path.is_file():
            raise PlanlmError(f"{folder}: not a planned-LM folder (planned_lm.json missing); "
                              f"give the out_dir of a finished `planlm train-lm`")
        stage_manifest(folder)  # a train-lm folder: the cheap check of its files, one line per damaged file
        fix = fix_for(folder)
        with reading(config_path, fix):
            values = load_json(config_path, fix)
            check_format(values, config_path, folder)
            try:
                config = PlannedLMConfig.from_dict(values)
            except (PluginImportError, UnknownKind) as e:  # an adapter of someone's own code: name this folder
                raise e.at(str(folder)) from None
        with reading(folder / "lm", fix):
            lm = AutoModelForCausalLM.from_pretrained(str(folder / "lm"))
        codebook = None
        if (folder / "codebook.safetensors").is_file():
            codebook = load_safetensors(folder / "codebook.safetensors", fix)["centroids"]
        model = cls(config, lm, codebook)
        if model.adapter is not None:
            with reading(folder / "adapter.safetensors", fix):
                model.adapter.load_state_dict(load_safetensors(folder / "adapter.safetensors", fix))
        model.folder = folder
        model.plan_folders = recorded_plan_folders(folder)
        return model.to(map_location)

    def push_to_hub(self, repo_id: str, **kwargs) -> str:
        """Upload the folder this model was saved to or loaded from to the Hub repo ``repo_id`` (``planlm.hub``)."""
        from planlm.hub import push_to_hub

        if self.folder is None:
            raise PlanlmError("push_to_hub: this model has no folder yet; save_pretrained(folder) first")
        return push_to_hub(self.folder, repo_id, **kwargs)

    def load_tokenizer(self, folder: str | Path | None = None):
        """The tokenizer saved with a model folder (default: its own; falls back to the config's tokenizer name)."""
        from planlm.data.resources import load_tokenizer

        path = Path(folder or self.folder or ".") / "tokenizer"
        return load_tokenizer(str(path) if path.is_dir() else self.config.tokenizer)


def recorded_plan_folders(folder: str | Path) -> dict[str, str]:
    """The folders a saved planned LM's plans come from: its card's training block; a model trained with its planner
    (``train.joint``) names the planner in its own folder, wherever the folder has moved, not the one training
    started from."""
    training = (read_planlm_block(folder) or {}).get("training") or {}
    folders = {key: training[key] for key in PLAN_FOLDERS if training.get(key)}
    own = Path(folder) / JOINT_PLANNER
    if (own / planner.WEIGHTS_FILE).is_file():
        folders["planner_dir"] = str(own)
    return folders


def add_evaluation(model_dir: str | Path, metrics: dict) -> bool:
    """Record an evaluation in the card of a planned-LM folder (replacing the entry of the same corpus, split,
    protocol and plans) -> whether the card changed. A folder without planned_lm.json (a bare HF LM) or one that
    cannot be written (a Hub cache snapshot, a read-only copy) keeps its card."""
    folder = Path(model_dir)
    if not (folder / "planned_lm.json").is_file() or not os.access(folder, os.W_OK):
        return False
    block = read_planlm_block(folder) or {}
    entry = evaluation_entry(metrics)
    same = ("prepared_dir", "split", "protocol", "conditioning", "K", "T", "tau")
    kept = [e for e in block.get("evaluations", []) if any(e.get(k) != entry.get(k) for k in same)]
    config = PlannedLMConfig.from_dict(json.loads((folder / "planned_lm.json").read_text()))
    try:
        write_card(folder, planned_lm_card(config, block.get("training"), kept + [entry]))
    except OSError:
        return False
    return True


__all__ = ["PlannedLM", "PlannedLMConfig", "load_causal_lm", "add_evaluation", "recorded_plan_folders",
           "JOINT_PLANNER"]
