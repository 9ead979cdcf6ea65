"""k-means over sentence embeddings: the centroids are the codebook of abstract writing actions.

Backends:

- ``faiss`` (default): Lloyd iterations with faiss (on every GPU when faiss was built with CUDA),
  run a few iterations per call so that a progress bar can show the inertia. faiss's own silent
  subsampling (``max_points_per_centroid``) is switched off: the fit uses every train embedding,
  or exactly ``fit_sample`` of them when that is set. Empty clusters are re-seeded by faiss (it
  splits the largest cluster).
- ``sklearn``: ``sklearn.cluster.KMeans`` (the paper's reference; slow on millions of sentences).

Initialisation: ``k-means++`` (the paper's choice). For faiss, k-means++ seeds are computed with
``sklearn.cluster.kmeans_plusplus`` on a seeded subsample of at most ``INIT_SAMPLE_PER_ACTION`` points per action:
k-means++ is sequential and costs O(points x actions x log(actions)), which on the full corpus would take longer
than the fit; the Lloyd iterations (``NUM_ITERATIONS``) then use every point.

Assignment: every sentence (train included) gets its nearest centroid (squared L2), computed in
chunks straight from the memory-mapped embeddings. For train sentences this is the cluster of the
fit, as the centroids are those of the last Lloyd step.

Letters: N sentences, E embedding width, A actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from planlm.console import note, open_bar
from planlm.errors import PlanlmError

MIN_SENTENCES_PER_ACTION = 39
"""Below this many training sentences per action a codebook is fitted on too little (faiss's own threshold,
``min_points_per_centroid``, under which it warns)."""
NUM_ITERATIONS = 25
"""Lloyd iterations (faiss) / the iteration cap (scikit-learn, which also stops on its ``tol``)."""
INIT_SAMPLE_PER_ACTION = 32
"""faiss: the k-means++ seeds are drawn from a seeded subsample of this many points per action."""


@dataclass
class ActionsConfig:
    """k-means that turns sentence embeddings into actions."""

    num_actions: int = 128
    """Number of clusters = abstract writing actions (the paper: 1,024)."""
    backend: Literal["faiss", "sklearn"] = "faiss"
    """faiss (fast, on every GPU when faiss was built with CUDA) or scikit-learn (the paper's reference)."""
    fit_sample: int | None = None
    """Fit on a seeded subsample of this many train sentences (None: all of them); every sentence is
    still assigned to its nearest centroid."""
    seed: int = 0
    """Seed of the initialisation and subsampling."""

    def __post_init__(self):
        if self.num_actions < 1:
            raise PlanlmError(f"--actions.num_actions must be >= 1 (got {self.num_actions})")
        if self.fit_sample is not None and self.fit_sample < self.num_actions:
            raise PlanlmError(f"--actions.fit_sample ({self.fit_sample}) must be >= --actions.num_actions "
                              f"({self.num_actions}) or null")


_ITERATIONS_PER_CALL = 5


def _faiss_gpus(config: ActionsConfig) -> int:
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def _flat_index(dim: int, num_gpus: int):
    import faiss

    index = faiss.IndexFlatL2(dim)
    return faiss.index_cpu_to_all_gpus(index) if num_gpus else index


def _fit_rows(num_rows: int, config: ActionsConfig) -> np.ndarray | None:
    if config.fit_sample is None or config.fit_sample >= num_rows:
        return None
    rng = np.random.default_rng(config.seed)
    return np.sort(rng.choice(num_rows, size=config.fit_sample, replace=False))


def initial_centroids(x: np.ndarray, config: ActionsConfig) -> np.ndarray:
    """(A, E) starting centroids from the (N, E) fit data."""
    rng = np.random.default_rng(config.seed)
    from sklearn.cluster import kmeans_plusplus

    init_sample = INIT_SAMPLE_PER_ACTION * config.num_actions
    sample = x
    if len(x) > init_sample:
        sample = x[np.sort(rng.choice(len(x), size=init_sample, replace=False))]
    # float64: scikit-learn computes float32 distances through a much slower upcasting path
    centers, _ = kmeans_plusplus(np.asarray(sample, dtype=np.float64), config.num_actions, random_state=config.seed)
    return np.ascontiguousarray(centers, dtype=np.float32)


def _fit_faiss(x: np.ndarray, config: ActionsConfig, progress: bool) -> tuple[np.ndarray, float]:
    import faiss

    num_gpus = _faiss_gpus(config)
    params = faiss.ClusteringParameters()
    params.seed = config.seed
    params.max_points_per_centroid = 1 << 30  # no silent subsampling: fit_sample says what is used
    params.min_points_per_centroid = 1
    params.verbose = False
    centroids = initial_centroids(x, config)
    index = _flat_index(x.shape[1], num_gpus)
    bar = open_bar(f"k-means (faiss{', gpu' if num_gpus else ''})", NUM_ITERATIONS, "iterations", progress)
    inertia = float("nan")
    done = 0
    while done < NUM_ITERATIONS:
        # a few Lloyd steps per call: the bar advances, at a small fixed cost per call
        params.niter = min(_ITERATIONS_PER_CALL, NUM_ITERATIONS - done)
        clustering = faiss.Clustering(x.shape[1], config.num_actions, params)
        faiss.copy_array_to_vector(centroids.ravel(), clustering.centroids)
        clustering.train(x, index)
        centroids = faiss.vector_float_to_array(clustering.centroids).reshape(config.num_actions, x.shape[1])
        stats = clustering.iteration_stats
        inertia = float(stats.at(stats.size() - 1).obj)  # of the last assignment step
        done += params.niter
        bar.advance(params.niter)
    bar.close()
    return np.ascontiguousarray(centroids, dtype=np.float32), inertia


def _fit_sklearn(x: np.ndarray, config: ActionsConfig, progress: bool) -> tuple[np.ndarray, float]:
    from sklearn.cluster import KMeans

    with open_bar("k-means (scikit-learn)", enabled=progress):
        km = KMeans(n_clusters=config.num_actions, init="k-means++", n_init=1, max_iter=NUM_ITERATIONS,
                    random_state=config.seed).fit(x)
    return np.ascontiguousarray(km.cluster_centers_, dtype=np.float32), float(km.inertia_)


def fit_codebook(embeddings: np.ndarray, config: ActionsConfig, *, progress: bool = True) -> np.ndarray:
    """Fit k-means on the (N, E) train embeddings (a memmap is fine) and return the (A, E) codebook."""
    num_rows = len(embeddings)
    if config.num_actions > num_rows:
        raise PlanlmError(f"--actions.num_actions ({config.num_actions}) is larger than the number of training "
                          f"sentences ({num_rows}); lower --actions.num_actions or use a bigger corpus")
    rows = _fit_rows(num_rows, config)
    # the one in-RAM copy of the fit data (faiss and scikit-learn need a contiguous float32 array)
    x = np.ascontiguousarray(embeddings if rows is None else embeddings[rows], dtype=np.float32)  # (N, E)
    if len(x) < MIN_SENTENCES_PER_ACTION * config.num_actions:
        note(f"planlm: k-means: {len(x):,} training sentences for {config.num_actions:,} actions "
             f"({len(x) / config.num_actions:.1f} per action, fewer than {MIN_SENTENCES_PER_ACTION}): a thin codebook; "
             f"use at most {max(1, len(x) // MIN_SENTENCES_PER_ACTION):,} actions or more articles")
    fit = _fit_faiss if config.backend == "faiss" else _fit_sklearn
    centroids, _ = fit(x, config, progress)
    return centroids


def assign_actions(embeddings: np.ndarray, codebook: np.ndarray, *, chunk_size: int = 65536,
                   use_gpu: bool = True, progress: bool = True, desc: str = "assigning") -> np.ndarray:
    """(N,) int64 index of the nearest centroid of every row, read from ``embeddings`` chunk by chunk."""
    import faiss

    num_gpus = faiss.get_num_gpus() if use_gpu and hasattr(faiss, "get_num_gpus") else 0
    index = _flat_index(codebook.shape[1], num_gpus)
    index.add(np.ascontiguousarray(codebook, dtype=np.float32))
    actions = np.empty(len(embeddings), dtype=np.int64)  # (N,)
    with open_bar(desc, len(embeddings), "sentences", progress and len(embeddings) > 0) as bar:
        for start in range(0, len(embeddings), chunk_size):
            chunk = np.ascontiguousarray(embeddings[start:start + chunk_size], dtype=np.float32)
            _, nearest = index.search(chunk, 1)  # (chunk, 1)
            actions[start:start + len(chunk)] = nearest[:, 0]
            bar.advance(len(chunk))
    return actions


def inertia(embeddings: np.ndarray, codebook: np.ndarray, actions: np.ndarray, chunk_size: int = 65536) -> float:
    """Sum of squared distances of the rows to their assigned centroids."""
    total = 0.0
    for start in range(0, len(embeddings), chunk_size):
        chunk = np.asarray(embeddings[start:start + chunk_size], dtype=np.float64)
        diff = chunk - codebook[actions[start:start + chunk_size]]
        total += float(np.einsum("ne,ne->", diff, diff))
    return total
