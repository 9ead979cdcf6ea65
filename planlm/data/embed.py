"""Sentence embeddings streamed to a memory-mappable ``.npy`` file, in resumable chunks.

The output is created with ``np.lib.format.open_memmap`` and filled chunk by chunk, so the only
copy of the embeddings is the file itself (a chunk of ``CHUNK_SIZE`` rows lives in RAM at a time).
After every chunk the file is flushed and ``<name>.progress.json`` records how many chunks are done
together with a fingerprint of (encoder, its settings, the exact sentence texts): an interrupted
run resumes after the last finished chunk, and a run on other sentences or with another encoder
starts over. Within a chunk sentences are encoded longest first (as ``SentenceTransformer.encode``
does), so batches hold sentences of similar length and padding stays small. With several CUDA
devices the chunks go through sentence-transformers' multi-process pool (one process per GPU).
``precision: bf16`` encodes under bf16 autocast (its weights cast to bf16 in a multi-process pool, where
autocast cannot reach); the embeddings are stored in fp32 either way.

Letters: N sentences, E embedding width.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from planlm.args import arithmetic, read_precision
from planlm.console import open_bar
from planlm.data.resources import DEFAULT_ENCODER, load_sentence_encoder
from planlm.device import check_bf16, resolve_device
from planlm.errors import PlanlmError
from planlm.files import require_space
from planlm.jsonio import fingerprint, read_record, write_json


_BATCHES_PER_CALL = 4  # encode() calls carry a small fixed cost; the bar still moves often
CHUNK_SIZE = 8192
"""Sentences per resumable chunk (the unit written to disk and recorded as done)."""


@dataclass
class EmbedConfig:
    """Sentence encoder and batching."""

    encoder: str = DEFAULT_ENCODER
    """SentenceTransformer name or folder (``all-MiniLM-L6-v2`` resolves to the offline copy; the paper
    uses ``sentence-transformers/all-mpnet-base-v2``)."""
    batch_size: int = 64
    """Sentences per forward pass (the paper: 256 on GPU)."""
    precision: str = "fp32"
    """fp32, bf16 (bf16 autocast on CUDA or a CPU with AVX512-BF16 / AMX: faster, and close to the fp32 embedding,
    see docs/benchmarks.md; the actions can change), native (bf16 where it is native,
    fp32 elsewhere) or auto (bf16 on CUDA, fp32 elsewhere)."""
    device: str | None = None
    """``cpu``, ``cuda``, ``cuda:1`` ...; None picks CUDA when present, and every CUDA device (through
    sentence-transformers' multi-process pool) when there are several."""

    def __post_init__(self):
        if self.batch_size < 1:
            raise PlanlmError(f"--embedding.batch_size must be >= 1 (got {self.batch_size})")
        self.precision = read_precision(self.precision, "--embedding.precision")


def texts_hash(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def _progress_path(out_path: Path) -> Path:
    return out_path.with_name(out_path.name + ".progress.json")


def _target_devices(config: EmbedConfig) -> list[str] | None:
    """The CUDA devices for the multi-process pool, or None for a single device."""
    if (config.device and config.device != "cuda") or not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(count)] if count > 1 else None


def embed_sentences(texts: Sequence[str], out_path: str | Path, config: EmbedConfig | None = None,
                    desc: str = "embedding", progress: bool = True, known: Sequence[np.ndarray] = (),
                    known_id: str = "") -> np.ndarray:
    """Encode ``texts`` into ``out_path`` (an (N, E) float32 ``.npy``) and return it memory-mapped.

    Resumes a previous interrupted call on the same texts and encoder; returns at once when the
    file is already complete. ``texts`` is read through ``len``, one pass (its hash) and one slice per chunk of
    ``CHUNK_SIZE``, so it may be a sequence that makes the strings of a slice only when asked
    (``planlm.data.spool.SentenceTexts``). ``known``: blocks of embeddings of the first texts, in order, copied (chunk by
    chunk) rather than encoded: the LM's training sentences at the head of the planner's split; ``known_id``
    names where they come from, in the resume key.
    """
    config = config or EmbedConfig()
    device_type = resolve_device(config.device or "auto").type  # the encoder's device (load_sentence_encoder's rule)
    config = replace(config, precision=arithmetic(config.precision, device_type))
    out_path = Path(out_path)
    progress_path = _progress_path(out_path)
    num_sentences = len(texts)
    num_known = sum(len(block) for block in known)
    key = {"encoder": config.encoder, "normalize": False, "chunk_size": CHUNK_SIZE, "texts": texts_hash(texts),
           "num_sentences": num_sentences}
    if config.precision != "fp32":  # fp32 files written before the setting existed stay resumable
        key["precision"] = config.precision
    if known:
        key["known"] = [num_known, known_id]
    num_chunks = -(-(num_sentences - num_known) // CHUNK_SIZE)  # chunks of the rows to encode
    record = read_record(progress_path)
    resumable = record.get("key") == fingerprint(key) and out_path.is_file()
    if resumable and record.get("done") == num_chunks:
        return np.load(out_path, mmap_mode="r")

    model = load_sentence_encoder(config.encoder, config.device)
    check_bf16(config.precision, model.device.type, "--embedding.precision")
    dim = model.get_embedding_dimension()
    # The file is filled in place through a memory map, where a full disk kills the process without an error: the
    # space of the rows still to write must be free before any is written.
    if resumable:
        out = np.lib.format.open_memmap(out_path, mode="r+")
        if out.shape != (num_sentences, dim):
            resumable = False
        else:
            rows_left = max(0, num_sentences - num_known - int(record["done"]) * CHUNK_SIZE)
            require_space(out_path, rows_left * dim * 4, desc)
    if not resumable:
        old_bytes = out_path.stat().st_blocks * 512 if out_path.is_file() else 0  # unlinked below
        require_space(out_path, max(0, num_sentences * dim * 4 - old_bytes), desc)
        record = {"key": fingerprint(key), "done": 0, "num_sentences": num_sentences, "dim": dim}
        write_json(progress_path, {})  # not resumable until the known rows are in
        out_path.unlink(missing_ok=True)  # a new file, never written into: a codebook folder may link the old one
        out = np.lib.format.open_memmap(out_path, mode="w+", dtype=np.float32, shape=(num_sentences, dim))
        _copy_known(known, out, dim, CHUNK_SIZE)
        write_json(progress_path, record)
    done = int(record["done"])
    devices = _target_devices(config)
    if devices and config.precision == "bf16":  # the pool's processes copy the model, out of autocast's reach:
        model = copy.deepcopy(model).to(torch.bfloat16)  # a bf16 copy (the encoder is cached, shared in-process)
    pool = model.start_multi_process_pool(devices) if devices and done < num_chunks else None
    autocast = torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16")
    bar = open_bar(desc, num_sentences, "sentences", progress, completed=min(num_known + done * CHUNK_SIZE,
                                                                              num_sentences))
    try:
        with autocast:
            _encode_chunks(model, texts, out, record, range(done, num_chunks), config, pool, bar, progress_path,
                           first=num_known)
    finally:
        bar.close()
        if pool is not None:
            model.stop_multi_process_pool(pool)
    del out
    return np.load(out_path, mmap_mode="r")


def _copy_known(known: Sequence[np.ndarray], out: np.ndarray, dim: int, chunk_size: int) -> None:
    """Copy the blocks of known embeddings into the head of ``out``, ``chunk_size`` rows at a time."""
    row = 0
    for block in known:
        if block.ndim != 2 or block.shape[1] != dim:
            raise PlanlmError(f"embeddings of shape {tuple(block.shape)} cannot join sentences embedded with width "
                              f"{dim}; embed them with the same encoder")
        for start in range(0, len(block), chunk_size):
            rows = np.asarray(block[start:start + chunk_size], dtype=np.float32)
            out[row:row + len(rows)] = rows
            row += len(rows)
    out.flush()


def _encode_chunks(model, texts: Sequence[str], out: np.ndarray, record: dict, chunks: range, config: EmbedConfig,
                   pool, bar, progress_path: Path, first: int = 0) -> None:
    """Encode ``chunks`` of ``texts[first:]`` into ``out``, recording each finished chunk in ``progress_path``."""
    num_sentences = len(texts)
    for chunk in chunks:
        start = first + chunk * CHUNK_SIZE
        stop = min(start + CHUNK_SIZE, num_sentences)
        chunk_texts = list(texts[start:stop])
        if pool is not None:
            out[start:stop] = model.encode(chunk_texts, pool=pool, batch_size=config.batch_size,
                                           convert_to_numpy=True)
            bar.advance(stop - start)
        else:
            # longest first, like SentenceTransformer.encode, a few batches per call for the bar
            order = np.argsort([-len(t) for t in chunk_texts], kind="stable")
            group = config.batch_size * _BATCHES_PER_CALL
            for b in range(0, len(order), group):
                rows = order[b:b + group]
                out[start + rows] = model.encode([chunk_texts[i] for i in rows], batch_size=config.batch_size,
                                                 show_progress_bar=False, convert_to_numpy=True)
                bar.advance(len(rows))
        out.flush()
        record["done"] = chunk + 1
        write_json(progress_path, record)
