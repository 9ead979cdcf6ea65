"""``planlm actions``: what the abstract writing actions look like.

For every action: how many sentences it holds and the sentences nearest its centroid (among the
sentences assigned to it), printed as text and written as ``actions.md``; the cluster-size
distribution as ``cluster_sizes.png``; and the same numbers as ``actions.json``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planlm.data.artifacts import PreparedDataset
from planlm.jsonio import write_json


def nearest_members(embeddings: np.ndarray, actions: np.ndarray, codebook: np.ndarray, num_nearest: int,
                    chunk_size: int = 65536) -> dict[int, list[tuple[int, float]]]:
    """For every action, up to ``num_nearest`` (sentence, squared distance) of its members, closest first."""
    distances = np.empty(len(actions), dtype=np.float64)  # (N,)
    for start in range(0, len(actions), chunk_size):
        chunk = np.asarray(embeddings[start:start + chunk_size], dtype=np.float64)  # (n, E)
        diff = chunk - codebook[actions[start:start + chunk_size]]
        distances[start:start + len(chunk)] = np.einsum("ne,ne->n", diff, diff)
    order = np.lexsort((distances, actions))  # by action, then distance
    sorted_actions = actions[order]
    starts = np.searchsorted(sorted_actions, np.arange(len(codebook)), side="left")
    stops = np.searchsorted(sorted_actions, np.arange(len(codebook)), side="right")
    return {a: [(int(s), float(distances[s])) for s in order[lo:min(hi, lo + num_nearest)]]
            for a, (lo, hi) in enumerate(zip(starts, stops))}


def action_distances(embeddings: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """(N, E) embeddings, codebook (A, E) -> (N, A) squared L2 distances to every centroid (as k-means assigns)."""
    embeddings = np.asarray(embeddings, dtype=np.float32).reshape(-1, codebook.shape[1])
    codebook = np.asarray(codebook, dtype=np.float32)
    return (embeddings ** 2).sum(1)[:, None] - 2 * embeddings @ codebook.T + (codebook ** 2).sum(1)[None]


def nearest_actions(embeddings: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """(N, E) embeddings -> (N,) index of the nearest centroid of codebook (A, E) (squared L2, as k-means)."""
    return action_distances(embeddings, codebook).argmin(1).astype(np.int64)


def ranked_actions(embeddings: np.ndarray, codebook: np.ndarray, top: int) -> np.ndarray:
    """(N, E) embeddings -> (N, min(top, A)) the ``top`` nearest centroids of each, nearest first."""
    distances = action_distances(embeddings, codebook)
    return np.argsort(distances, axis=1, kind="stable")[:, :top].astype(np.int64)


def _plot_sizes(sizes: np.ndarray, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ranked = np.sort(sizes)[::-1]
    left.bar(np.arange(len(ranked)), ranked, width=1.0, color="tab:blue")
    left.set_xlabel("action (ranked by size)")
    left.set_ylabel("sentences")
    left.set_title("cluster sizes, largest first")
    right.hist(sizes, bins=min(50, max(5, len(sizes) // 4)), color="tab:orange")
    right.set_xlabel("sentences per action")
    right.set_ylabel("actions")
    right.set_title("distribution of cluster sizes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


MAX_CHARS = 160
"""Longer sentences are shortened to this many characters in the output."""


def actions(prepared_dir: str, out_dir: str | None = None, split: str = "train") -> Path:
    """Show each abstract writing action: its size and the sentences nearest its centroid.

    Writes ``actions.md`` (every action, with its 5 nearest sentences), ``actions.json`` and ``cluster_sizes.png``
    (the cluster-size distribution) into ``out_dir`` and prints the 20 largest actions.

    Args:
        prepared_dir: A folder written by ``planlm prepare``.
        out_dir: Where to write the files (default: ``<prepared_dir>/actions``).
        split: Which split's sentences to show (train, validation, test).

    Returns:
        The folder holding actions.md, actions.json and cluster_sizes.png.
    """
    return describe_actions(prepared_dir, out_dir, split)


def describe_actions(prepared_dir: str, out_dir: str | None = None, split: str = "train", num_nearest: int = 5,
                     max_print: int = 20) -> Path:
    """``planlm actions`` with ``num_nearest`` sentences per action and the ``max_print`` largest actions printed
    (a run's report shows 3 and prints none)."""
    prepared = PreparedDataset(prepared_dir)
    data = prepared.split(split)
    codebook = prepared.codebook.numpy().astype(np.float64)  # (A, E)
    split_actions = np.asarray(data.actions)  # (N,)
    num_actions = prepared.num_actions
    sizes = np.bincount(split_actions, minlength=num_actions)  # (A,)
    nearest = nearest_members(data.embeddings, split_actions, codebook, num_nearest)
    out = Path(out_dir) if out_dir else Path(prepared_dir) / "actions"
    out.mkdir(parents=True, exist_ok=True)

    def shorten(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…"

    records = []
    for action in np.argsort(-sizes, kind="stable"):
        action = int(action)
        records.append({"action": action, "size": int(sizes[action]),
                        "share": float(sizes[action] / max(1, len(split_actions))),
                        "nearest": [{"sentence": s, "distance": round(d, 6), "text": data.sentence_text(s)}
                                    for s, d in nearest[action]]})
    total = len(split_actions)
    empty = int((sizes == 0).sum())
    header = (f"{num_actions} actions over {total:,} {split} sentences of {prepared.path} "
              f"(encoder {prepared.encoder_name}); largest {sizes.max() if total else 0:,}, "
              f"median {int(np.median(sizes)):,}, smallest {sizes.min():,}, empty {empty}")
    lines = ["# Abstract writing actions", "", header, "", "![cluster sizes](cluster_sizes.png)", "",
             "| action | sentences | share | nearest sentences to the centroid |", "| ---: | ---: | ---: | --- |"]
    for r in records:
        texts = "<br>".join(f"{i + 1}. {shorten(n['text'])}".replace("|", "\\|") for i, n in enumerate(r["nearest"]))
        lines.append(f"| {r['action']} | {r['size']:,} | {r['share']:.2%} | {texts or '(empty)'} |")
    (out / "actions.md").write_text("\n".join(lines) + "\n")
    write_json(out / "actions.json", {"prepared_dir": str(prepared.path), "split": split,
                                      "num_actions": num_actions, "sentences": total, "empty": empty,
                                      "actions": records})
    _plot_sizes(sizes, out / "cluster_sizes.png", f"{num_actions} actions, {total:,} {split} sentences")

    print(header)
    for r in records[:max_print]:
        print(f"\naction {r['action']}: {r['size']:,} sentences ({r['share']:.1%})")
        for n in r["nearest"]:
            print(f"  - {shorten(n['text'])}")
    print(f"\nwrote {out / 'actions.md'}, {out / 'actions.json'}, {out / 'cluster_sizes.png'}")
    return out
