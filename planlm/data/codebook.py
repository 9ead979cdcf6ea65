"""``planlm codebook``: the same prepared corpus with its action codebook drawn again, from another k-means seed.

A codebook is one draw of k-means: another initialisation gives other clusters, so other actions for the planner
to predict and for the LM to read. A run whose seeds draw the whole method (``planlm run`` with
``seed_draws: method``) gives each seed its own codebook this way, so that the seed-to-seed spread of its results
holds the codebook's share too.

The folder written is a complete prepared folder (``planlm.data.artifacts``) that every stage reads as it reads
``planlm prepare``'s. What does not depend on the codebook (the articles, sentences, embeddings, tokens and the
tokenizer) is hard-linked from the source folder, so a codebook costs the disk of its actions only (a copy where
the two folders lie on different file systems); the codebook and every split's ``actions.npy`` and
``token_actions.npy`` are its own. The k-means settings are the source folder's, with ``actions.seed`` replaced.
The writers of a prepared folder replace a file rather than write into it, so a rebuilt source never changes the
files of a codebook folder drawn from it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Optional

import numpy as np

from planlm.data.artifacts import ARRAYS, CHUNK_TOKENS, NpyStream, PreparedDataset
from planlm.data.kmeans import ActionsConfig, assign_actions, fit_codebook, inertia
from planlm.errors import PlanlmError
from planlm.files import file_sha256, save_safetensors
from planlm.stage import StageDir, config_fingerprint, read_manifest
from planlm.stage.integrity import FORMAT_KEY

_OWN = ("actions", "token_actions")  # the arrays a codebook changes; the other ARRAYS are linked


def codebook(prepared_dir: str, seed: int, out_dir: Optional[str] = None) -> Path:
    """Draw the action codebook of a prepared corpus again, with k-means seed ``seed``.

    Writes a prepared folder that shares the corpus, the embeddings and the tokens of ``prepared_dir`` (hard links)
    and holds its own codebook and actions: k-means with the settings ``prepared_dir`` was fitted with, its
    initialisation and subsampling drawn from ``seed``. Reused when complete for the same source and seed.

    Args:
        prepared_dir: A folder written by ``planlm prepare``.
        seed: The k-means seed of the new codebook (the source's own seed gives its own codebook again).
        out_dir: Where to write it (default: ``<prepared_dir>-codebook<seed>``).

    Returns:
        The folder written.
    """
    source = Path(prepared_dir)
    manifest = read_manifest(source)
    if manifest is None or "kmeans" not in manifest:
        raise PlanlmError(f"{source}: not a finished prepared folder (no manifest with a k-means record); run "
                          f"`planlm prepare --out_dir {source}` first")
    dataset = PreparedDataset(source)  # checks the source's files
    out = Path(out_dir) if out_dir is not None else source.parent / f"{source.name}-codebook{seed}"
    if out.resolve() == source.resolve():
        raise PlanlmError(f"--out_dir {out} is the prepared folder itself; choose another folder")
    fields = {f.name for f in dataclasses.fields(ActionsConfig)}
    actions = ActionsConfig(**{**{k: v for k, v in manifest["config"]["actions"].items() if k in fields},
                               "seed": seed})
    config = {**manifest["config"], "actions": dataclasses.asdict(actions),
              "codebook_of": config_fingerprint(source)}
    with StageDir(out, config) as stage:
        if stage.reused:
            print(f"planlm codebook: {out} is complete for this source and seed; reusing it")
            return out
        record = _draw(source, out, manifest, dataset, actions, progress=True)
        stage.finish(**record)
    print(f"planlm codebook: wrote {out} (k-means seed {seed}, inertia per sentence "
          f"{record['kmeans']['inertia_per_sentence']:.4g}, {record['kmeans']['empty_clusters']} empty clusters)")
    return out


def _draw(source: Path, out: Path, manifest: dict, dataset: PreparedDataset, actions: ActionsConfig,
          progress: bool) -> dict:
    """Link the shared files, fit the codebook on the split the source was fitted on, assign every split; the
    manifest record (the source's, with this codebook's k-means figures, hashes and tokenizer folder)."""
    import torch

    splits = list(manifest["counts"])
    if (source / "tokenizer").is_dir():
        for path in sorted((source / "tokenizer").rglob("*")):
            if path.is_file():
                _link(path, out / "tokenizer" / path.relative_to(source / "tokenizer"))
    for split in splits:
        for name in ("articles.jsonl", *(f"{a}.npy" for a in ARRAYS if a not in _OWN)):
            _link(source / split / name, out / split / name)
    codebook = fit_codebook(dataset.split(dataset.planner_split).embeddings, actions, progress=progress)  # (A, E)
    kmeans = dict(manifest["kmeans"])
    for split in splits:
        part = dataset.split(split)
        split_actions = assign_actions(part.embeddings, codebook, progress=progress,
                                       desc=f"assigning {split}")  # (N_sent,)
        if split == "train":
            kmeans["inertia_per_sentence"] = inertia(part.embeddings, codebook, split_actions) / max(1, len(split_actions))
            kmeans["empty_clusters"] = int(actions.num_actions - len(np.unique(split_actions)))
        np.save(out / split / "actions.npy", split_actions.astype(np.int64))
        plan = part.token_plan_sentence  # (N_tok,) memory-mapped: read a chunk at a time, never held whole
        with NpyStream(out / split / "token_actions.npy", len(plan)) as token_actions:
            for start in range(0, len(plan), CHUNK_TOKENS):
                token_actions.write(split_actions[plan[start:start + CHUNK_TOKENS]])
    save_safetensors({"centroids": torch.from_numpy(codebook)}, out / "codebook.safetensors")
    hashes = {name: file_sha256(out / name) for name in manifest["hashes"]}
    tokenizer = manifest["tokenizer"]
    if (source / "tokenizer").is_dir() and Path(tokenizer).resolve() == (source / "tokenizer").resolve():
        tokenizer = str((out / "tokenizer").resolve())
    keep = {k: v for k, v in manifest.items() if k not in ("config", "config_fingerprint", "versions", "created",
                                                          "files", "kmeans", "hashes", "tokenizer", FORMAT_KEY)}
    return {**keep, "kmeans": kmeans, "hashes": hashes, "tokenizer": tokenizer, "codebook_seed": actions.seed,
            "drawn_from": str(source)}


def _link(path: Path, target: Path) -> None:
    """``target`` as a hard link to ``path`` (a copy across file systems)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(path, target)
    except OSError:
        shutil.copy2(path, target)
