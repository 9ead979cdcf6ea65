"""planlm in lm-evaluation-harness: ``lm_eval --model planlm --model_args model_dir=runs/x/lm/ours,num_paths=10
--tasks <task>`` (``pip install -e ".[eval]"``).

lm-eval finds the model ``planlm`` through the ``lm_eval.models`` entry point (lm-eval releases with plugin
discovery) or, with releases before it (0.4.13 and older), through ``python -m planlm.evaluate.lm_harness``,
which registers it and runs lm-eval's own command line with the same arguments.

The three request types, with the plans of ``planlm evaluate`` and ``planlm generate``:

- ``loglikelihood_rolling`` (perplexity tasks): each text is a document of the model's corpus
  (``planlm.data.texts``: the corpus's sentence splitter, encoder and codebook); every sentence boundary is planned
  from the true sentences before it by the plan source of the model's plans (``planlm.plans.registry.plan_source``),
  one plan vector per sentence (``planlm.evaluate.perplexity.plan_vector_table``), with the alignment of training
  (the last token of a sentence carries the next sentence's plan). The windows are lm-eval's own (``max_length``
  tokens, disjoint, the first one after the end-of-text token), so a ``none`` model scores exactly like ``--model hf``.
- ``loglikelihood``: the plans come from the context's sentences only. The context's complete sentences (those that
  end before the continuation, by the splitter on context + continuation) are the planner's context; the
  continuation is scored with the plan of the sentence it writes, whatever it spans. Requests with the same context
  share their plans, so the choices of a multiple-choice question are scored under the same plans.
- ``generate_until``: ``PlannedGenerator`` (re-planning whenever the splitter sees a generated sentence end, as
  ``planlm generate``), stopped once a stop sequence appears and cut before it.

model_args: ``model_dir`` (a planned-LM folder or Hub repo id; a bare HF causal-LM folder runs as plans kind none),
``prepared_dir`` (the model's prepared corpus: its splitter, encoder and codebook; default: the one its training
recorded), the plans (``kind``, ``num_paths`` K, ``horizon`` T, ``temperature`` tau, ``seed``, ``planner_dir``,
``path_policy`` with ``min_paths``, ``entropy_high``; unset: the model's own),
``max_length``, ``batch_size``, ``device``, ``precision``. An unknown key or a folder that is no model is one line
naming the argument and the fix (this module prints uncaught ``PlanlmError`` as one line, as the planlm CLI does).

Letters: B sequences in a batch, L tokens, V vocabulary, D LM width, N sentences.
"""

from __future__ import annotations

import inspect
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
import lm_eval.models  # noqa: F401  lm-eval lists its own models only into an empty registry: before ours
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from planlm.data.artifacts import PreparedDataset, token_plan_sentence
from planlm.data.tokens import assign_tokens_to_sentences
from planlm.device import autocast, resolve_device
from planlm.errors import PlanlmError

NAMES = ("model_dir", "prepared_dir", "kind", "planner_dir", "path_policy", "device", "precision")  # never parsed


@dataclass
class Scored:
    """One sequence to score: input_ids (L+1 tokens, the last only a target), the plan-table row of each input
    token (None: no plans) and how many of the last tokens are scored."""

    ids: list[int]
    rows: Optional[list[int]]
    num_scored: int


@register_model("planlm")
class PlannedLMEval(TemplateLM):
    """A planned LM (``planlm train-lm`` folder or Hub repo id) as an lm-eval model; see the module docstring."""

    def __init__(self, model_dir: str, prepared_dir: Optional[str] = None, kind: Optional[str] = None,
                 num_paths: Optional[int] = None, horizon: Optional[int] = None,
                 temperature: Optional[float] = None, seed: Optional[int] = None, planner_dir: Optional[str] = None,
                 path_policy: Optional[str] = None, min_paths: Optional[int] = None,
                 entropy_high: Optional[float] = None,
                 max_length: Optional[int] = None, batch_size: int | str = 16, max_batch_size: Optional[int] = None,
                 device: str = "auto", precision: str = "auto"):
        super().__init__()
        from planlm.data.resources import load_tokenizer
        from planlm.hub import local_folder

        self.model_dir = str(local_folder(model_dir, "model_args model_dir"))
        self.model = _load_planlm_model(self.model_dir, model_dir)
        values = dict(kind=kind, num_paths=num_paths, horizon=horizon, temperature=temperature, seed=seed,
                      planner_dir=planner_dir)
        policy = dict(kind=path_policy, min_paths=min_paths, entropy_high=entropy_high)
        self.plans = _evaluation_plans(self.model, self.model_dir, values, policy)
        self.prepared = _prepared_corpus(self.model, self.model_dir, prepared_dir) if self.has_plans else None
        self._device = _device(device)
        self.precision = precision
        self.model.to(self.device).eval()
        self.tokenizer = self.model.load_tokenizer() if self.model.folder else load_tokenizer(self.model_dir)
        self._max_length = int(max_length) if max_length else _lm_positions(self.model.lm)
        self.batch_size = _batch_size(batch_size)

    # ----------------------------------------------------------------------------- lm-eval plumbing
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: Optional[dict] = None):
        """``key=value,...`` with lm-eval's value parsing, except for the names (``kind=none`` stays "none")."""
        from lm_eval.utils import handle_arg_string

        one_line_errors()
        pairs = [item.split("=", 1) for item in (arg_string or "").split(",") if item.strip()]
        for pair in pairs:
            if len(pair) != 2:
                raise PlanlmError(f"--model_args {pair[0]}: give key=value pairs, e.g. model_dir=runs/x/lm/ours")
        args = {key.strip(): value.strip() if key.strip() in NAMES else handle_arg_string(value)
                for key, value in pairs}
        return cls.create_from_arg_obj(args, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: Optional[dict] = None):
        """As lm-eval's, after checking every model_args key (one line naming an unknown one and the keys)."""
        one_line_errors()
        known = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
        for key in arg_dict:
            if key not in known:
                raise PlanlmError(f"--model_args {key}={arg_dict[key]}: planlm knows no argument {key!r}; use "
                                  f"{', '.join(known)}")
        if "model_dir" not in arg_dict:
            raise PlanlmError("--model_args: planlm needs model_dir=<a planlm train-lm folder or Hub repo id>")
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k in known}
        return cls(**arg_dict, **extra)

    @property
    def has_plans(self) -> bool:
        return self.plans.has_plans

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> list[int]:
        return self.tokenizer(string, add_special_tokens=bool(add_special_tokens))["input_ids"]

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    # ----------------------------------------------------------------------------- requests
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """((context, continuation), context_enc, continuation_enc) -> (log p(continuation), greedy)."""
        if not self.has_plans:
            return self._score([Scored(context + continuation, None, len(continuation))
                                for _, context, continuation in requests])
        rows, plan_table = self._context_plan_rows(requests)
        return self._score([Scored(context + continuation, row, len(continuation))
                            for (_, context, continuation), row in zip(requests, rows)], plan_table)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text in lm-eval's disjoint max_length windows, every sentence planned from the ones before it."""
        texts = [request.args[0] for request in requests]
        documents = self._documents(texts) if self.has_plans else None
        items, owner = [], []
        for d, text in enumerate(texts):
            ids, rows, first_row = documents.tokens(d) if documents else (self.tok_encode(text), None, None)
            positions = list(range(len(ids)))
            windows = map(make_disjoint_window, get_rolling_token_windows(positions, -1, self.max_length, 1))
            for context, scored in windows:
                sequence = context + scored  # positions; -1 is the end-of-text token before the text
                items.append(Scored([ids[p] if p >= 0 else self.prefix_token_id for p in sequence],
                                    [rows[p] if p >= 0 else first_row for p in sequence] if self.has_plans else None,
                                    len(scored)))
                owner.append(d)
        totals = np.zeros(len(texts))
        for d, (logprob, _) in zip(owner, self._score(items, documents.plan_table if documents else None)):
            totals[d] += logprob
        return totals.tolist()

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy or sampled continuation with re-planning at generated sentence ends, cut at the stop sequences."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        from planlm.evaluate.generator import SamplingConfig

        generator = self._generator()
        outputs = []
        for request in requests:
            context, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(gen_kwargs, 256)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=self.tok_decode([self.eot_token_id]))
            temperature = float(kwargs.get("temperature") or 0.0) if kwargs["do_sample"] else 0.0
            sampling = SamplingConfig(max_new_tokens=int(kwargs["max_gen_toks"]), temperature=temperature,
                                      top_k=kwargs.get("top_k"), top_p=kwargs.get("top_p"))
            text = generator.generate(generator.prompt_from_text(context), sampling,
                                      stop=[stop for stop in until if stop]).text
            for stop in until:
                text = text.split(stop)[0] if stop else text
            outputs.append(text)
        return outputs

    # ----------------------------------------------------------------------------- scoring
    @torch.no_grad()
    def _score(self, items: list[Scored], plan_table: Optional[torch.Tensor] = None) -> list[tuple[float, bool]]:
        """Batched causal-LM scoring of ``items`` as lm-eval's HF backend does: the last max_length + 1 tokens,
        right-padded batches (no attention mask needed for a causal LM), longest first; ``plan_table`` (N, D) holds
        the plan vectors the items' rows index."""
        results: list[tuple[float, bool]] = [(0.0, True)] * len(items)
        order = sorted(range(len(items)), key=lambda i: -len(items[i].ids[-(self.max_length + 1):]))
        for start in range(0, len(order), self.batch_size):
            batch = [items[i] for i in order[start:start + self.batch_size]]
            inputs = [item.ids[-(self.max_length + 1):][:-1] for item in batch]
            width = max(len(ids) for ids in inputs)
            input_ids = torch.zeros(len(batch), width, dtype=torch.long)  # (B, L) right-padded
            for b, ids in enumerate(inputs):
                input_ids[b, :len(ids)] = torch.tensor(ids)
            kwargs = {}
            if plan_table is not None:
                rows = torch.full((len(batch), width), -1, dtype=torch.long)  # (B, L); -1: padding, no plan
                for b, item in enumerate(batch):
                    item_rows = item.rows[-(self.max_length + 1):][:-1]
                    rows[b, :len(item_rows)] = torch.tensor(item_rows)
                kwargs["plan_embeds"] = self.model.token_plan_embeds(plan_table, rows.to(self.device))
            with autocast(self.device, self.precision):
                logits = self.model(input_ids=input_ids.to(self.device), **kwargs).logits  # (B, L, V)
            for b, (item, index) in enumerate(zip(batch, order[start:start + self.batch_size])):
                length = len(inputs[b])
                targets = torch.tensor(item.ids[-item.num_scored:], device=self.device)  # (P,)
                scored = F.log_softmax(logits[b, length - item.num_scored:length].float(), dim=-1)  # (P, V)
                greedy = bool((scored.argmax(-1) == targets).all())
                results[index] = (float(scored.gather(1, targets[:, None]).sum()), greedy)
        return results

    # ----------------------------------------------------------------------------- plans
    def _documents(self, texts: list[str], spans: Optional[list] = None) -> "Documents":
        """The texts as a prepared split of the model's corpus, with the plan vector of each of its sentences."""
        from planlm.data.texts import prepare_texts
        from planlm.evaluate.generate import encoder_embed_fn
        from planlm.evaluate.perplexity import plan_vector_table
        from planlm.plans.registry import plan_source

        embed_fn = encoder_embed_fn(self.prepared) if self._reads_sentences else None
        with tempfile.TemporaryDirectory(prefix="planlm-lm-eval-") as tmp:
            prepared = prepare_texts(tmp, texts, self.prepared, self.tokenizer, spans=spans, embed_fn=embed_fn)
            split = prepared.split("texts")
            source = plan_source(self.plans, prepared, split, device=self.device, precision=self.precision)
            plan_table = plan_vector_table(self.model, source, np.arange(split.num_sentences), split.num_sentences,
                                           device=self.device, precision=self.precision)  # (N, D)
            return Documents(np.array(split.input_ids), np.array(split.token_offsets),
                             np.array(split.token_plan_sentence), np.array(split.sentence_offsets),
                             np.array(split.sentence_spans), plan_table)

    @property
    def _reads_sentences(self) -> bool:
        kind = self.plans.plan_kind
        return kind.reads_future or kind.uses_planner

    def _context_plan_rows(self, requests) -> tuple[list[list[int]], torch.Tensor]:
        """The plan-table row of every input token of each loglikelihood request (plans from the context only) and
        the plan table. A context's trailing whitespace belongs to its continuation (lm-eval's encoding)."""
        from planlm.data.texts import sentence_spans

        contexts = [context.rstrip() for (context, _), _, _ in requests]
        full = sentence_spans([context + continuation for (context, continuation), _, _ in requests],
                              self.prepared.sentence_splitter)
        keys = [(context, tuple(_context_spans(context, spans))) for context, spans in zip(contexts, full)]
        unique = list(dict.fromkeys(keys))  # requests with the same context share its plans
        documents = self._documents([context for context, _ in unique], [list(spans) for _, spans in unique])
        index = {key: d for d, key in enumerate(unique)}
        rows = [documents.context_rows(index[key], self.tokenizer, key[0], len(context_enc), len(continuation_enc))
                for key, (_, context_enc, continuation_enc) in zip(keys, requests)]
        return rows, documents.plan_table

    def _generator(self):
        """A PlannedGenerator with the model's plans, planner, corpus encoder and splitter."""
        from planlm.evaluate.generate import encoder_embed_fn
        from planlm.evaluate.generator import PlannedGenerator
        from planlm.models.planner import Planner

        if self.plans.plan_kind.reads_future:
            raise PlanlmError(f"model_args kind={self.plans.kind}: generate_until has no true future to read; use "
                              f"kind planner_sampled, planner_argmax, fixed or none")
        planner = Planner.for_corpus(self.plans.planner_dir, self.prepared, self.device) if self.plans.planner_dir \
            else None
        embed_fn = encoder_embed_fn(self.prepared) if planner is not None else None
        splitter = self.prepared.sentence_splitter if self.prepared else "sentencizer"
        return PlannedGenerator(self.model, self.tokenizer, self.plans, planner=planner, embed_fn=embed_fn,
                                sentence_splitter=splitter, device=self.device, seed=self.plans.seed,
                                precision=self.precision)


@dataclass
class Documents:
    """The token and sentence arrays of a prepared split of lm-eval texts (rows index the plan table)."""

    input_ids: np.ndarray
    token_offsets: np.ndarray
    token_plan_sentence: np.ndarray
    sentence_offsets: np.ndarray
    sentence_spans: np.ndarray
    plan_table: torch.Tensor
    """(N, D) the plan vector of every sentence."""

    def tokens(self, d: int) -> tuple[list[int], list[int], int]:
        """(input ids, plan row of each token, plan row of the text's first sentence) of document d."""
        a, b = int(self.token_offsets[d]), int(self.token_offsets[d + 1])
        return self.input_ids[a:b].tolist(), self.token_plan_sentence[a:b].tolist(), int(self.sentence_offsets[d])

    def context_rows(self, d: int, tokenizer, context: str, context_len: int, continuation_len: int) -> list[int]:
        """Plan rows of context_enc + continuation_enc: context tokens by their sentence, the continuation (and a
        prefix token standing for an empty context) with the plan of the context's open sentence, aligned as
        in training (the last token of a sentence carries the next sentence's plan)."""
        first, last = int(self.sentence_offsets[d]), int(self.sentence_offsets[d + 1])
        spans = self.sentence_spans[first:last]
        open_sentence = last - first - 1
        local = [open_sentence] * context_len
        if context:
            encoding = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
            offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)[:context_len]
            local[:len(offsets)] = assign_tokens_to_sentences(offsets, spans).tolist()
        local += [open_sentence] * continuation_len
        aligned = token_plan_sentence(np.asarray(local, np.int64), np.asarray([0, len(local)]))
        return (aligned + first).tolist()


def _context_spans(context: str, text_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The context's complete sentences (by the splitter on context + continuation) and its open sentence (the one
    the continuation writes; empty when the continuation starts a new sentence)."""
    complete = [(a, b) for a, b in text_spans if b <= len(context)]
    start = next((a for a, b in text_spans if b > len(context)), len(context))
    return complete + [(min(start, len(context)), len(context))]


def _load_planlm_model(folder: str, given: str):
    from planlm.evaluate.loading import load_model

    try:
        return load_model(folder)
    except PlanlmError as e:
        raise PlanlmError(f"model_args model_dir={given}: {e}") from None


def _evaluation_plans(model, model_dir: str, values: dict, policy: dict):
    from planlm.hub import local_folder
    from planlm.plans.config import PlanConfig, evaluation_plans
    from planlm.plans.policy import PathPolicy

    if values["planner_dir"]:
        values["planner_dir"] = str(local_folder(values["planner_dir"], "model_args planner_dir"))
    set_policy = {k: v for k, v in policy.items() if v is not None}
    path_policy = PathPolicy(**set_policy) if set_policy else None
    plans = evaluation_plans(PlanConfig(**values, path_policy=path_policy), model, model_dir)
    plans.check_source()
    return plans


def _prepared_corpus(model, model_dir: str, prepared_dir: Optional[str]) -> PreparedDataset:
    """The model's prepared corpus (its splitter, encoder and codebook), checked against the model."""
    from planlm.evaluate.loading import check_compatible
    from planlm.stage import read_manifest

    recorded = (read_manifest(model_dir) or {}).get("prepared_dir")
    path = prepared_dir or recorded
    if not path or not (Path(path) / "manifest.json").is_file():
        raise PlanlmError(f"model_args prepared_dir={path}: no prepared corpus there; give prepared_dir=<the prepared "
                          f"corpus {model_dir} was trained on> (its sentence splitter, encoder and codebook)")
    prepared = PreparedDataset(path)
    split = prepared.split(prepared.manifest.get("splits", ["test"])[0])
    check_compatible(model, prepared, split, model_dir)
    return prepared


def _device(device: str) -> torch.device:
    """``device``, or the CPU when it names CUDA on a machine without it (lm-eval's command line asks for cuda by
    default; its hf backend falls back the same way)."""
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        print(f"planlm: --device {device}: no CUDA device here; running on the CPU", file=sys.stderr)
        return torch.device("cpu")
    return resolve_device(device)


def _lm_positions(lm) -> int:
    config = lm.config
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    return 2048


def _batch_size(value) -> int:
    try:
        size = int(value)
    except (TypeError, ValueError):
        raise PlanlmError(f"--batch_size {value}: planlm takes a number of sequences per forward pass (no 'auto'); "
                          f"give e.g. --batch_size 16") from None
    if size < 1:
        raise PlanlmError(f"--batch_size {value} must be >= 1")
    return size


def one_line_errors() -> None:
    """Print an uncaught PlanlmError as one line, as the planlm CLI does: lm-eval's command line has no place for a
    backend's input errors. Installed (once) when lm-eval makes the model, and by ``main``; never at import, so that
    importing planlm leaves the process's hook alone."""
    if not getattr(sys.excepthook, "planlm_one_line", False):
        sys.excepthook = _one_line_errors(sys.excepthook)


def _one_line_errors(previous_hook):
    def hook(kind, error, traceback):
        if issubclass(kind, PlanlmError):
            print(f"planlm: error: {error}", file=sys.stderr)
            return
        previous_hook(kind, error, traceback)

    hook.planlm_one_line = True
    return hook


def main() -> None:
    """``python -m planlm.evaluate.lm_harness <lm_eval arguments>``: lm-eval's command line with ``planlm`` registered
    (for lm-eval releases without entry-point plugins)."""
    from lm_eval.__main__ import cli_evaluate

    one_line_errors()
    cli_evaluate()


if __name__ == "__main__":
    main()


__all__ = ["PlannedLMEval", "main"]
