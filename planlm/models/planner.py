"""The multi-step planner (paper section 3.2): representation h, dynamics g, prediction f.

    z_{1:i-1}   = h(t_1 .. t_{i-1})                       context sentences -> latents
    z_{1:i+k}   = g(z_{1:i+k-1}, a_{i+k-1})   1 <= k < T   append Emb(action), transformer over the set
    p(a_{i+k})  = f(z_{1:i+k})                0 <= k < T   transformer, masked mean pool, linear

A learned start latent is always prepended by h, so the first sentence of an article (empty
context) has a valid state. With ``encoder="article"`` (beside the paper's per-boundary encoder, "boundary")
the context is read causally, so one pass over an article serves every boundary of it (``article_forward``
for training, ``article_start`` for decoding; planlm.models.dynamics_causal). g and f come as one ``Dynamics`` (planlm.models.dynamics): the paper's
recurrent g, which re-encodes the grown set each step, or (``dynamics="causal"``) a prefix-causal g and f
with a key/value cache (planlm.models.dynamics_causal), which makes extra paths cheap. The planner runs
h, then hands the latents to its dynamics: teacher forcing in training (``forward``), step-by-step
decoding for the argmax path, and ``sample_paths`` for K paths, batched over paths and boundaries. A walk
over a corpus reads each batch's contexts once (``start``) and continues that state to the argmax path
(``decode``) and to the sampled paths (``sample_from``).

Letters: B batch (boundaries), S context sentences, T horizon, K paths, A actions, D width
(d_model), E sentence-embedding width, N flattened rows, n latents in a state, R article rows, J boundaries
of a row (its sentences + 1).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

from planlm.errors import PlanlmError
from planlm.files import file_sha256, honour_umask
from planlm.jsonio import write_json
from planlm.models.dynamics import Dynamics, RecurrentDynamics
from planlm.models.dynamics_causal import CausalDynamics
from planlm.stage.integrity import with_format

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PREPARED_FILE = "prepared.json"
DYNAMICS: dict[str, type[Dynamics]] = {"recurrent": RecurrentDynamics, "causal": CausalDynamics}


@dataclass
class PlannerSettings:
    """The planner's sizes as a user sets them (``--model.*``); ``PlannerConfig`` adds what the prepared corpus
    gives (num_actions, embedding_dim)."""

    d_model: int = 256
    """D: width of the latents, of f and of g (the paper: 768)."""
    num_heads: int = 4
    """Attention heads of the f and g transformers (the paper: 2)."""
    num_layers: int = 1
    """Transformer layers in f and in g each (the paper: 1)."""
    dim_feedforward: int = 1024
    """Feed-forward width of the f and g transformer layers (the paper: 2048)."""
    max_sentences: int = 64
    """Context window of h: the last max_sentences sentences before the boundary."""
    horizon: int = 10
    """T: number of future actions the planner is trained to predict."""
    dropout: float = 0.1
    """Dropout in h, f and g."""
    dynamics: Literal["recurrent", "causal"] = "recurrent"
    """g and f: "recurrent" is the paper's (g re-encodes the grown set of latents at every step); "causal"
    encodes the set with a prefix-causal mask and a key/value cache (planlm.models.dynamics_causal): the same
    parameter counts, all T steps trained in one pass, and sampling costs one token per path and step."""
    encoder: Literal["boundary", "article"] = "boundary"
    """How the context is read: "boundary" is the paper's (each boundary's context encoded on its own, every
    latent seeing the whole context); "article" reads it causally (latent j sees latents <= j), so one pass
    over an article computes every boundary of it: about 1/15 of the encoder work on 30-sentence pieces.
    Needs dynamics "causal" (the paper's g re-encodes every latent at each step: nothing to share)."""
    finetune_encoder: bool = False
    """h runs the prepared corpus's sentence encoder on the sentence texts and trains it end to end
    (slow; the paper's 110M-parameter h)."""

    def __post_init__(self):
        for name in ("d_model", "num_heads", "num_layers", "dim_feedforward", "max_sentences", "horizon"):
            if getattr(self, name) < 1:
                raise PlanlmError(f"planner config: {name}={getattr(self, name)} must be >= 1; fix --model.{name}")
        if self.d_model % self.num_heads:
            raise PlanlmError(f"planner config: d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                              f"fix --model.d_model or --model.num_heads")
        if not 0.0 <= self.dropout < 1.0:
            raise PlanlmError(f"planner config: dropout={self.dropout} must be in [0, 1); fix --model.dropout")
        if self.dynamics not in DYNAMICS:
            raise PlanlmError(f"planner config: dynamics={self.dynamics!r}; choose {' or '.join(DYNAMICS)} "
                              f"(fix --model.dynamics)")
        if self.encoder not in ("boundary", "article"):
            raise PlanlmError(f"planner config: encoder={self.encoder!r}; choose boundary or article "
                              f"(fix --model.encoder)")
        if self.encoder == "article" and self.dynamics != "causal":
            raise PlanlmError(f"planner config: encoder=article needs dynamics=causal (got {self.dynamics!r}: the "
                              f"paper's g re-encodes every latent); set --model.dynamics causal")
        if self.encoder == "article" and self.finetune_encoder:
            raise PlanlmError("planner config: encoder=article reads the prepared embeddings; it does not finetune "
                              "the sentence encoder (set --model.finetune_encoder false or --model.encoder boundary)")


@dataclass
class PlannerConfig(PlannerSettings):
    """A planner's whole config: its ``PlannerSettings`` and the corpus's sizes (saved as ``config.json`` next to the
    weights)."""

    num_actions: int = 1024
    """A: number of abstract writing actions (codebook rows)."""
    embedding_dim: int = 384
    """E: width of the prepared sentence embeddings (the input of h)."""
    encoder_name: Optional[str] = None
    """SentenceTransformer name or folder for finetune_encoder (the prepared corpus's encoder)."""

    def reuse_key(self) -> dict[str, Any]:
        """The config as a planner folder's reuse key holds it: every field."""
        return asdict(self)

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_actions", "embedding_dim"):
            if getattr(self, name) < 1:
                raise PlanlmError(f"planner config: {name}={getattr(self, name)} must be >= 1")
        if self.finetune_encoder and not self.encoder_name:
            raise PlanlmError("planner config: finetune_encoder needs encoder_name (the prepared corpus's encoder)")

    @classmethod
    def from_dict(cls, values: dict) -> "PlannerConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


def sinusoidal_positions(slots: torch.Tensor, width: int) -> torch.Tensor:
    """slots (...,) long -> (..., width) the Transformer paper's sinusoidal encoding."""
    half = width // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=slots.device, dtype=torch.float32) / half)
    angles = slots.float().unsqueeze(-1) * freqs  # (..., width/2)
    encoding = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return F.pad(encoding, (0, width - 2 * half))


class SentencePositions(nn.Module):
    """Position of a latent in its article window (0 start latent, 1.. context sentences, then plan steps), as the
    sinusoidal encoding."""

    def __init__(self, config: PlannerConfig):
        super().__init__()
        self.width = config.d_model

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        return sinusoidal_positions(slots, self.width)


class Representation(nn.Module):
    """h: context sentence embeddings -> latents (start latent + projected, positioned sentences)."""

    def __init__(self, config: PlannerConfig):
        super().__init__()
        self.projection = nn.Linear(config.embedding_dim, config.d_model)
        self.start_latent = nn.Parameter(torch.randn(config.d_model) * 0.02)
        self.positions = SentencePositions(config)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = None
        if config.finetune_encoder:
            from sentence_transformers import SentenceTransformer

            from planlm.data.resources import resolve_encoder

            # A private copy: the encoder's weights belong to this planner and are trained with it.
            self.encoder = SentenceTransformer(resolve_encoder(config.encoder_name), device="cpu")

    def embed_sentences(self, texts: list[str]) -> torch.Tensor:
        """texts (N,) -> (N, E) embeddings from the (trainable) sentence encoder inside h."""
        if self.encoder is None:
            raise PlanlmError("planner: embed_sentences needs a planner built with finetune_encoder=True")
        device = self.projection.weight.device
        preprocess = getattr(self.encoder, "preprocess", None) or self.encoder.tokenize  # renamed in s-t 6
        features = {name: value.to(device) if torch.is_tensor(value) else value
                    for name, value in preprocess(texts).items()}
        return self.encoder(features)["sentence_embedding"]  # (N, E)

    def forward(self, context_embeds: torch.Tensor, context_mask: torch.Tensor):
        """context_embeds (B, S, E), context_mask (B, S) -> latents (B, 1+S, D), latent_mask (B, 1+S), next_slot (B,)."""
        batch_size = context_embeds.shape[0]
        context_mask = context_mask.bool()
        slots = torch.cumsum(context_mask.long(), dim=1)  # (B, S) 1.. for real sentences
        latents = self.projection(context_embeds.to(self.projection.weight.dtype))  # (B, S, D)
        latents = latents + self.positions(slots)  # (B, S, D)
        start = (self.start_latent + self.positions(torch.zeros(1, dtype=torch.long, device=latents.device)))
        start = start.expand(batch_size, 1, -1)  # (B, 1, D)
        latents = self.dropout(torch.cat([start, latents], dim=1))  # (B, 1+S, D)
        start_mask = torch.ones(batch_size, 1, dtype=torch.bool, device=context_mask.device)
        latent_mask = torch.cat([start_mask, context_mask], dim=1)  # (B, 1+S)
        next_slot = context_mask.sum(dim=1) + 1  # (B,)
        return latents, latent_mask, next_slot


class Planner(nn.Module):
    """p(a_i .. a_{i+T-1} | t_1 .. t_{i-1}) factorised autoregressively over the T steps."""

    def __init__(self, config: PlannerConfig, codebook: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.representation = Representation(config)  # h
        self.dynamics = DYNAMICS[config.dynamics](config, self.representation.positions)  # g
        self.prediction = self.dynamics.prediction_class(config)  # f
        self.prepared_info: dict = {}  # num_actions, embedding_dim, codebook_hash, encoder of the training corpus
        if codebook is not None:
            self.init_from_codebook(codebook)

    @torch.no_grad()
    def init_from_codebook(self, codebook: torch.Tensor) -> None:
        """codebook (A, E). When E == D it is copied; otherwise it is mapped to D through h's (initial)
        projection, i.e. each row is how a sentence at that centroid would enter the latent space."""
        if codebook.shape != (self.config.num_actions, self.config.embedding_dim):
            raise PlanlmError(f"planner: codebook of shape {tuple(codebook.shape)} does not match num_actions="
                              f"{self.config.num_actions}, embedding_dim={self.config.embedding_dim}")
        codebook = codebook.to(self.representation.projection.weight)
        if self.config.embedding_dim == self.config.d_model:
            rows = codebook  # (A, D)
        else:
            rows = codebook @ self.representation.projection.weight.T  # (A, D)
        self.prediction.classifier.weight.copy_(rows)
        self.prediction.classifier.bias.zero_()
        self.dynamics.action_embedding.weight.copy_(rows)

    def embed_sentences(self, texts: list[str]) -> torch.Tensor:
        return self.representation.embed_sentences(texts)

    def rollout(self, context_embeds: torch.Tensor, context_mask: torch.Tensor, horizon: int,
                target_actions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run h, then f and g for ``horizon`` steps: feed ``target_actions`` (teacher forcing) or, when None,
        the planner's own argmax actions. Returns logits (B, T, A) and the fed/argmax actions (B, T)."""
        latents, latent_mask, slot = self.representation(context_embeds, context_mask)
        if target_actions is not None:
            fed = target_actions[:, :horizon].clamp(min=0)  # masked steps (-100) feed action 0
            return self.dynamics.teacher_forcing(self.prediction, latents, latent_mask, slot, fed), fed
        return self._greedy(self.dynamics.start(self.prediction, latents, latent_mask, slot, horizon), horizon)

    def forward(self, context_embeds: torch.Tensor, context_mask: torch.Tensor,
                target_actions: torch.Tensor) -> torch.Tensor:
        """Teacher forcing. context_embeds (B, S, E), context_mask (B, S) [True = real sentence; S may be 0],
        target_actions (B, T) -> logits (B, T, A); step t sees the true actions of steps < t."""
        logits, _ = self.rollout(context_embeds, context_mask, target_actions.shape[1], target_actions)
        return logits

    def article_forward(self, context_embeds: torch.Tensor, context_mask: torch.Tensor,
                        target_actions: torch.Tensor) -> torch.Tensor:
        """Teacher forcing for every boundary of article rows in one pass (encoder "article").
        context_embeds (R, S, E), context_mask (R, S): a row's sentences; target_actions (R, S+1, T): the targets
        of boundary j = 0 .. S (context: the row's first j sentences) -> logits (R, S+1, T, A)."""
        self._check_article()
        latents, latent_mask, _ = self.representation(context_embeds, context_mask)  # (R, S+1, D)
        fed = target_actions.clamp(min=0)  # masked steps (-100) feed action 0
        return self.dynamics.article_teacher_forcing(self.prediction, latents, latent_mask, fed)

    @torch.no_grad()
    def article_start(self, context_embeds: torch.Tensor, context_mask: torch.Tensor, row: torch.Tensor,
                      bound: torch.Tensor, horizon: int):
        """The decoding state (``Dynamics.start``'s) of boundary ``bound[b]`` of article row ``row[b]``, (B,) each,
        from one pass per row (encoder "article"; eval mode). context_embeds (R, S, E), context_mask (R, S)."""
        self._check_article()
        latents, latent_mask, _ = self.representation(context_embeds, context_mask)
        return self.dynamics.article_start(self.prediction, latents, latent_mask, row, bound, horizon)

    @torch.no_grad()
    def start(self, context_embeds: torch.Tensor, context_mask: torch.Tensor, horizon: int):
        """The decoding state of every boundary after h (``Dynamics.start``'s; eval mode), its ``logits`` (B, A) the
        first step's: ``decode`` continues it to the greedy path and ``sample_from`` to sampled paths, so the plans
        of several kinds for one batch read the contexts once. context_embeds (B, S, E), context_mask (B, S)."""
        with self._evaluating():
            latents, latent_mask, slot = self.representation(context_embeds, context_mask)
            return self.dynamics.start(self.prediction, latents, latent_mask, slot, horizon)

    @torch.no_grad()
    def decode(self, state, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy path from a start state (one row per boundary; eval mode) -> logits (B, T, A), actions
        (B, T)."""
        with self._evaluating():
            return self._greedy(state, horizon)

    @torch.no_grad()
    def sample_from(self, state, num_paths: int | torch.Tensor, temperature: float,
                    generator: torch.Generator | None = None, top_actions: int = 0):
        """``sample_paths`` from a start state (``start`` or ``article_start``) at temperature > 0: the same draws,
        without reading the contexts again; with ``top_actions`` M > 0 also each step's M most likely actions and
        their probabilities (B, K, T, M), what plans in expectation read. A LongTensor
        ``num_paths`` (B,) of counts needs a dynamics that takes several in one call (``mixed_path_counts``)."""
        counts = num_paths if torch.is_tensor(num_paths) else None
        _check_sampling(num_paths if counts is None else int(counts.min()), state.horizon, temperature)
        if temperature == 0:
            raise PlanlmError("planner: sample_from draws at a temperature > 0; decode gives the greedy path")
        if counts is not None and not self.dynamics.mixed_path_counts:
            raise PlanlmError(f"planner: {self.config.dynamics} dynamics draw one K per call; sample_paths batches "
                              f"per-boundary counts")
        with self._evaluating():
            return self.dynamics.sample_from(self.prediction, state, num_paths, temperature, generator, top_actions)

    @contextmanager
    def _evaluating(self) -> Iterator[None]:
        """Eval mode (no dropout) inside, the mode before after."""
        was_training = self.training
        self.eval()
        try:
            yield
        finally:
            self.train(was_training)

    def _greedy(self, state, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed g its own argmax action for ``horizon`` steps from ``state`` -> logits (B, T, A), actions (B, T)."""
        logits, actions = [state.logits], [state.logits.argmax(dim=-1)]  # (B, A), (B,)
        for _ in range(1, horizon):
            state = self.dynamics.step(self.prediction, state, actions[-1])
            logits.append(state.logits)
            actions.append(state.logits.argmax(dim=-1))
        return torch.stack(logits, dim=1), torch.stack(actions, dim=1)

    def _check_article(self) -> None:
        if self.config.encoder != "article":
            raise PlanlmError(f"planner: article batches need a planner with encoder=article "
                              f"(this one has {self.config.encoder!r})")

    @torch.no_grad()
    def sample_paths(self, context_embeds: torch.Tensor, context_mask: torch.Tensor, num_paths: int | torch.Tensor,
                     horizon: int, temperature: float, generator: torch.Generator | None = None,
                     state=None) -> torch.Tensor:
        """Sample num_paths action paths per boundary -> LongTensor (B, K, T); temperature 0 = argmax.

        ``num_paths`` is one K for every boundary, or a LongTensor (B,) of per-boundary counts (an adaptive
        path policy, planlm.plans.policy): then K = its maximum and the paths of boundary b beyond
        num_paths[b] are zero padding. How the paths are batched is the dynamics' (``Dynamics.sample``).
        ``state``: these contexts' start state (``start``) when the caller holds it (the same draws; per-boundary
        counts under a dynamics with one K per call read each count's contexts again)."""
        counts = num_paths if torch.is_tensor(num_paths) else None
        most = num_paths if counts is None else int(counts.max())
        _check_sampling(most if counts is None else int(counts.min()), horizon, temperature)
        if temperature > 0 and counts is not None and not self.dynamics.mixed_path_counts:
            return self._sample_count_groups(context_embeds, context_mask, counts, horizon, temperature, generator)
        state = self.start(context_embeds, context_mask, horizon) if state is None else state
        if temperature == 0:
            return self.decode(state, horizon)[1].unsqueeze(1).expand(-1, most, -1)
        return self.sample_from(state, num_paths, temperature, generator)

    def _sample_count_groups(self, context_embeds: torch.Tensor, context_mask: torch.Tensor, counts: torch.Tensor,
                             horizon: int, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
        """Per-boundary counts for a dynamics that takes one K per call: one batch per distinct count
        -> (B, K_max, T), zero padding beyond each boundary's count."""
        most = int(counts.max())
        out = torch.zeros(len(counts), most, horizon, dtype=torch.long, device=context_embeds.device)
        for count in torch.unique(counts).tolist():
            rows = torch.nonzero(counts == count).squeeze(1).to(context_embeds.device)
            out[rows, :count] = self.sample_paths(context_embeds[rows], context_mask[rows], int(count), horizon,
                                                  temperature, generator)
        return out

    def path_logits(self, context_embeds: torch.Tensor, context_mask: torch.Tensor,
                    action_paths: torch.Tensor) -> torch.Tensor:
        """The distribution of every step of given paths, each step given its own path's earlier actions (teacher
        forcing, with gradients: joint training differentiates the plans it samples). context_embeds (B, S, E),
        context_mask (B, S), action_paths (B, K, T) -> logits (B, K, T, A). h reads each context once; the
        dynamics run the paths (``Dynamics.path_logits``)."""
        latents, latent_mask, slot = self.representation(context_embeds, context_mask)
        return self.dynamics.path_logits(self.prediction, latents, latent_mask, slot, action_paths.clamp(min=0))

    def sample_path_logits(self, context_embeds: torch.Tensor, context_mask: torch.Tensor, num_paths: int,
                           horizon: int, temperature: float, generator: torch.Generator | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """The K paths ``start`` then ``sample_from`` draw (the same draws for the same generator) and the logits
        each step was drawn from, with gradients (joint training; ``Dynamics.sample_logits``: one pass where the
        dynamics allow it). context_embeds (B, S, E), context_mask (B, S) -> paths (B, K, T), logits (B, K, T, A)."""
        _check_sampling(num_paths, horizon, temperature)
        latents, latent_mask, slot = self.representation(context_embeds, context_mask)
        return self.dynamics.sample_logits(self.prediction, latents, latent_mask, slot, num_paths, horizon,
                                           temperature, generator)

    @torch.no_grad()
    def first_step_logits(self, context_embeds: torch.Tensor, context_mask: torch.Tensor) -> torch.Tensor:
        """The logits of the first action of every path, p(a_i | t_1 .. t_{i-1}): (B, A)."""
        was_training = self.training
        self.eval()
        try:
            return self.rollout(context_embeds, context_mask, 1)[0][:, 0]  # (B, A)
        finally:
            self.train(was_training)

    # ---- persistence -------------------------------------------------------------------------------
    def save_pretrained(self, folder: str | Path) -> Path:
        """Write model.safetensors + config.json (with planlm's format_version) + prepared.json and, last, the model
        card into ``folder``."""
        from safetensors.torch import save_model

        from planlm.models.card import planner_card, write_card

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_model(self, str(folder / WEIGHTS_FILE))
        honour_umask(folder / WEIGHTS_FILE)  # safetensors writes 0600
        write_json(folder / CONFIG_FILE, with_format(asdict(self.config)))
        write_json(folder / PREPARED_FILE, self.prepared_info)
        write_card(folder, planner_card(self.config, self.prepared_info))  # last: a folder with a card is complete
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path, map_location: str | torch.device = "cpu") -> "Planner":
        """From a saved folder or a Hub repo id (``planlm.hub.local_folder``: the local cache when offline)."""
        from safetensors.torch import load_model

        from planlm.hub import local_folder
        from planlm.stage.integrity import load_json, reading

        folder = local_folder(folder, "planner")
        planner = cls(read_config(folder))
        fix = _retrain(folder)
        with reading(folder / WEIGHTS_FILE, fix):
            load_model(planner, str(folder / WEIGHTS_FILE), device=str(map_location))
        if (folder / PREPARED_FILE).is_file():
            planner.prepared_info = load_json(folder / PREPARED_FILE, fix)
        return planner.to(map_location)

    @classmethod
    def for_corpus(cls, folder: str | Path, prepared, map_location: str | torch.device = "cpu") -> "Planner":
        """A trained planner in eval mode, after checking that it was trained on ``prepared``'s actions."""
        planner = cls.from_pretrained(folder, map_location=map_location)
        planner.check_matches(prepared, where=str(folder))
        return planner.eval()

    def check_matches(self, prepared, where: str = "") -> None:
        """One-line PlanlmError when this planner was trained on other actions than ``prepared``'s."""
        info = self.prepared_info
        where = where or "planner"
        if self.config.num_actions != prepared.num_actions:
            raise PlanlmError(f"{where}: planner has num_actions={self.config.num_actions} but {prepared.path} has "
                              f"{prepared.num_actions}; train a planner on this prepared corpus")
        if self.config.embedding_dim != prepared.embedding_dim:
            raise PlanlmError(f"{where}: planner reads {self.config.embedding_dim}-d embeddings but {prepared.path} "
                              f"has {prepared.embedding_dim}-d; train a planner on this prepared corpus")
        if info.get("codebook_hash") and info["codebook_hash"] != prepared.codebook_hash:
            raise PlanlmError(f"{where}: planner was trained with codebook {info['codebook_hash'][:12]} but "
                              f"{prepared.path} has codebook {prepared.codebook_hash[:12]}; train a planner on "
                              f"this prepared corpus")
        if info.get("encoder") and info["encoder"] != prepared.encoder_name:
            raise PlanlmError(f"{where}: planner reads sentences embedded by {info['encoder']!r} but {prepared.path} "
                              f"was embedded by {prepared.encoder_name!r}; train a planner on this prepared corpus")


def read_config(folder: str | Path) -> PlannerConfig:
    """The config of the trained planner in the local ``folder`` (its horizon T: ``trained_horizon``), without its
    weights; one-line errors for a folder without a planner, a damaged one and one of another planlm's format."""
    from planlm.stage.integrity import check_format, load_json, reading, stage_manifest

    folder = Path(folder)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise PlanlmError(f"{folder}: no trained planner here ({name} missing); run `planlm train-planner "
                              f"--out_dir {folder}` first")
    stage_manifest(folder)  # a train-planner folder: the cheap check of its files, one line per damaged file
    with reading(folder / CONFIG_FILE, _retrain(folder)):
        values = load_json(folder / CONFIG_FILE, _retrain(folder))
        check_format(values, folder / CONFIG_FILE, folder)
        return PlannerConfig.from_dict(values)


def trained_horizon(folder: str | Path) -> int:
    """T, the horizon the planner in ``folder`` (a folder or a Hub repo id) was trained to predict."""
    from planlm.hub import local_folder

    return read_config(local_folder(folder, "planner")).horizon


def _retrain(folder: Path) -> str:
    return (f"retrain it: rerun `planlm train-planner --out_dir {folder}` or the `planlm run` that made it (it "
            f"rebuilds a damaged stage)")


def _check_sampling(num_paths: int, horizon: int, temperature: float) -> None:
    if num_paths < 1 or horizon < 1 or temperature < 0:
        raise PlanlmError(f"planner: need num_paths >= 1, horizon >= 1, temperature >= 0 "
                          f"(got {num_paths}, {horizon}, {temperature})")


def planner_hash(folder: str | Path | None) -> str | None:
    """sha256 of a planner folder's weights, for the cache keys of what its plans feed (None: no planner there).

    A folder's path says nothing about which planner it holds: a retrained planner keeps the path."""
    weights = Path(folder) / WEIGHTS_FILE if folder else None
    return file_sha256(weights) if weights is not None and weights.is_file() else None
