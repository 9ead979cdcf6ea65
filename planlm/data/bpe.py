"""A tokenizer trained on the corpus: ``planlm prepare --tokenizer bpe:V``.

A small LM trained from scratch spends most of its compute and parameters on GPT-2's 50,257-token
vocabulary (2 layers x 128 wide: 6.4M of its 6.9M parameters are the embedding table, and the output
projection dominates each step). A byte-level BPE of V tokens learned from the training split (GPT-2's
pre-tokenizer and byte alphabet, so any text still tokenizes) makes each step cheaper and gives each
embedding row more updates. It is trained with HF ``tokenizers`` on the training split only (no
evaluation text leaks into the vocabulary) and saved as a ``PreTrainedTokenizerFast`` folder in the
prepared folder (``tokenizer/``), whose path the manifest names as the corpus tokenizer; every later
stage loads it from there, and each LM saves a copy next to its weights.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from planlm.errors import PlanlmError
from planlm.files import honour_umask

PREFIX = "bpe:"
END_OF_TEXT = "<|endoftext|>"  # GPT-2's, the only special token
_BYTES = 256


def trained_vocab_size(tokenizer: str) -> int | None:
    """V of a ``bpe:V`` tokenizer spec; None for a tokenizer given by name or path."""
    if not tokenizer.startswith(PREFIX):
        return None
    size = tokenizer[len(PREFIX):]
    if not size.isdigit() or int(size) <= _BYTES:
        raise PlanlmError(f"--tokenizer {tokenizer}: a trained tokenizer is bpe:V with V > {_BYTES} (the byte alphabet "
                          f"plus merges), e.g. bpe:8192")
    return int(size)


def train_bpe(texts: Iterable[str], vocab_size: int, folder: Path) -> Path:
    """Train a byte-level BPE of ``vocab_size`` tokens on ``texts`` and save it to ``folder`` (atomically)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=True)  # character offsets as GPT-2's fast tokenizer's
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=END_OF_TEXT, bos_token=END_OF_TEXT,
                                   unk_token=END_OF_TEXT)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    fast.save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    honour_umask(folder)  # mkdtemp made it 0700
    return folder
