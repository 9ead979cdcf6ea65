"""Model cards: the README.md of every saved planned-LM and planner folder, in the Hub's model-card format.

The YAML header (``huggingface_hub.ModelCardData``) holds what the Hub indexes (``library_name``, ``tags``,
``base_model``, ``model-index`` with the measured perplexities) plus a ``planlm`` block with the rest: the
plan config, the adapter, the corpus and codebook hashes, the planner hash, training and every evaluation.
``ModelCard.load(folder / "README.md").data`` parses it back.

Who writes it: ``save_pretrained`` writes the card as its last file (atomically: a temporary file renamed),
so a folder with a card holds all its weights, and a stage's manifest, written after it, never marks a folder
complete whose card is missing or half-written. ``planlm evaluate`` adds its result to the model's card
(``planlm.models.planned_lm.add_evaluation``): one entry per (corpus, split, protocol, plans), the newest replacing an older one.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from planlm.hub import CARD_FILE  # re-exported: defined in the hub, which sits below the models
from planlm.jsonio import to_jsonable


def planned_lm_card(config, training: Optional[dict] = None, evaluations: Optional[list[dict]] = None):
    """The ModelCard of a PlannedLM with ``config`` (PlannedLMConfig); ``training`` (corpus and run facts) and
    ``evaluations`` (``evaluation_entry`` dicts) when known."""
    from huggingface_hub import ModelCard, ModelCardData

    evaluations = list(evaluations or [])
    plans = to_jsonable(config.plans)
    adapter = to_jsonable(config.adapter) if config.adapter is not None else None
    name = f"planlm-{plans['kind']}" + (f"-{adapter['kind']}" if adapter else "")
    block = {"plans": plans, "adapter": adapter, "base_model": config.base_model,
             "base_model_config": config.base_model_config, "finetune": config.finetune,
             "tokenizer": config.tokenizer, "num_actions": config.num_actions,
             "codebook_hash": config.codebook_hash, "planner_hash": config.planner_hash,
             "training": training or {}, "evaluations": evaluations}
    data = ModelCardData(library_name="planlm", pipeline_tag="text-generation", model_name=name,
                         base_model=_hub_base_model(config.base_model),
                         tags=["planlm", "planned-language-model", f"plans-{plans['kind']}"],
                         eval_results=[_eval_result(e) for e in evaluations] or None, planlm=block)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{_planned_lm_body(name, block)}")


def planner_card(config, prepared_info: dict):
    """The ModelCard of a Planner folder: its shape and the corpus (actions, codebook, encoder) it plans over."""
    from huggingface_hub import ModelCard, ModelCardData

    block = {"planner": to_jsonable(asdict(config)), "corpus": to_jsonable(prepared_info)}
    data = ModelCardData(library_name="planlm", model_name="planlm-planner", tags=["planlm", "planner"], planlm=block)
    body = (f"# planlm planner\n\nA multi-step planner over {config.num_actions} abstract writing actions (k-means "
            f"centroids of {config.embedding_dim}-d sentence embeddings), horizon T={config.horizon}, "
            f"width {config.d_model}. Codebook `{str(prepared_info.get('codebook_hash'))[:12]}`, encoder "
            f"`{prepared_info.get('encoder')}`.\n\n```python\nfrom planlm.models.planner import Planner\n"
            f"planner = Planner.from_pretrained(\"<this repo or folder>\")\n```\n")
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def write_card(folder: str | Path, card) -> Path:
    """Write ``card`` to ``folder/README.md`` atomically (a reader never sees half a card)."""
    path = Path(folder) / CARD_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(card), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_planlm_block(folder: str | Path) -> Optional[dict]:
    """The ``planlm`` block of a folder's card (None without a card)."""
    from huggingface_hub import ModelCard

    path = Path(folder) / CARD_FILE
    if not path.is_file():
        return None
    return ModelCard.load(path).data.to_dict().get("planlm")


def evaluation_entry(metrics: dict) -> dict:
    """The card's record of one ``planlm evaluate`` (its metrics.json)."""
    keys = ("ppl", "ci_low", "ci_high", "confidence", "nll", "tokens", "articles", "protocol", "split",
            "conditioning", "K", "T", "tau", "paths_mean", "prepared_dir")
    return {key: metrics.get(key) for key in keys}


def _hub_base_model(name: Optional[str]) -> Optional[str]:
    """The base model as the Hub links it: a repo id only (not a local folder, a GGUF file or an offline alias)."""
    from planlm.hub import is_repo_id
    from planlm.pretrained import SMOLLM2

    if not name or name == SMOLLM2 or Path(name).exists() or not is_repo_id(name):
        return None
    return name


def _eval_result(entry: dict):
    from huggingface_hub import EvalResult

    return EvalResult(task_type="text-generation", task_name="Language modeling",
                      dataset_type=str(entry.get("prepared_dir") or "planlm-prepared"),
                      dataset_name=f"{Path(str(entry.get('prepared_dir') or 'prepared')).name} ({entry.get('split')})",
                      dataset_split=entry.get("split"), metric_type="perplexity", metric_name="Perplexity",
                      metric_value=entry.get("ppl"),
                      metric_config=f"{entry.get('protocol')}; plans {entry.get('conditioning')} K={entry.get('K')} "
                                    f"T={entry.get('T')} tau={entry.get('tau')}")


def _planned_lm_body(name: str, block: dict) -> str:
    plans, adapter, training = block["plans"], block["adapter"], block["training"]
    lines = [f"# {name}", "",
             "A causal language model conditioned on plans of abstract writing actions (planlm: \"Learning to Plan "
             "Long-Term for Language Modeling\", Mai, Cornille, Moens).", "",
             "| | |", "|---|---|",
             f"| base LM | `{block['base_model'] or block['base_model_config']}` (finetune: {block['finetune']}) |",
             f"| plans | {plans['kind']}, K={plans.get('num_paths')}, T={plans.get('horizon')}, "
             f"tau={plans.get('temperature')} |",
             f"| adapter | {adapter['kind'] if adapter else 'none'} |",
             f"| actions | {block['num_actions']}, codebook `{str(block['codebook_hash'])[:12]}` |",
             f"| planner | `{str(block['planner_hash'])[:12]}` |",
             f"| corpus | `{str(training.get('corpus_fingerprint'))[:12]}` {training.get('prepared_dir') or ''} |"]
    if training.get("val_ppl") is not None:
        lines.append(f"| validation | ppl {training['val_ppl']:.3f} after {training.get('global_step')} steps |")
    if block["evaluations"]:
        lines += ["", "## Evaluations", "", "| split | protocol | plans | ppl | CI |", "|---|---|---|---|---|"]
        lines += [f"| {e['split']} | {e['protocol']} | {e['conditioning']} K={e['K']} T={e['T']} tau={e['tau']} | "
                  f"{e['ppl']:.3f} | [{e['ci_low']:.3f}, {e['ci_high']:.3f}] |" for e in block["evaluations"]]
    lines += ["", "## Use", "", "```python", "from planlm.models.planned_lm import PlannedLM",
              "model = PlannedLM.from_pretrained(\"<this repo or folder>\")", "```", "",
              "```", "lm_eval --model planlm --model_args model_dir=<this repo or folder> --tasks <task>", "```", ""]
    return "\n".join(lines)


__all__ = ["planned_lm_card", "planner_card", "write_card", "evaluation_entry",
           "read_planlm_block", "CARD_FILE"]
