"""``planlm prepare`` end to end on tiny corpora with the real offline MiniLM encoder and GPT-2 tokenizer:
offsets, token alignment, codebook, nearest-centroid actions, k-means backends, resume / reuse /
rebuild, bad inputs and the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from planlm.cli import main as cli_main
from planlm.data.artifacts import ARRAYS, SPLITS, PreparedDataset
from planlm.data.corpus import CorpusConfig, Skips
from planlm.data.embed import EmbedConfig, embed_sentences
from planlm.data.kmeans import ActionsConfig, assign_actions, fit_codebook, inertia
from planlm.data.prepare import SentencesConfig, prepare, take_articles
from planlm.data.resources import load_sentence_encoder, load_tokenizer, split_sentences
from planlm.data.windows import beyond_window_share
from planlm.device import cpu_supports_bf16
from planlm.errors import PlanlmError
from planlm.files import file_sha256
from planlm.stage import is_complete, read_manifest

SENTENCES = ["The river rises in the north.", "It flows south for two hundred miles.",
             "Many towns stand on its banks.", "The king built a tower.", "His son added a wall.",
             "The tower still stands today.", "Music was played at court.", "Songs told of old battles."]


def tiny_jsonl(path, num_articles: int = 10):
    """Articles of 3 sentences each, built from a small pool so k-means has structure."""
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for i in range(num_articles):
            picked = rng.choice(len(SENTENCES), size=3, replace=False)
            text = " ".join(SENTENCES[j] for j in picked) + f" Article {i} ends."
            f.write(json.dumps({"id": f"t{i}", "title": f"T{i}", "text": text}) + "\n")
    return path


def tiny_config(source, **actions) -> dict:
    return dict(corpus=CorpusConfig(source=str(source), num_validation=2, num_test=2),
                actions=ActionsConfig(**{"num_actions": 3, **actions}))


@pytest.fixture
def small_chunks():
    """Embedding chunks of 4 sentences (8,192 in planlm), so that tiny corpora have several to resume; a patch of
    its own, which a test's ``monkeypatch.undo()`` leaves in place."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("planlm.data.embed.CHUNK_SIZE", 4)
        yield


def test_manifest_counts_and_codebook(wiki_slice):
    ds = PreparedDataset(wiki_slice)
    manifest = ds.manifest
    assert ds.num_actions == 4 and ds.embedding_dim == 384
    assert ds.tokenizer_name == "gpt2" and ds.encoder_name == "all-MiniLM-L6-v2"
    assert manifest["splits"] == list(SPLITS)
    assert {s: c["articles"] for s, c in manifest["counts"].items()} == {"train": 24, "validation": 3, "test": 3}
    assert tuple(ds.codebook.shape) == (4, 384)
    assert ds.codebook_hash == file_sha256(wiki_slice / "codebook.safetensors")
    for split in SPLITS:
        data = ds[split]
        share = beyond_window_share(data.token_offsets, manifest["lm_window"])
        assert manifest["counts"][split] == {"articles": data.num_articles, "sentences": data.num_sentences,
                                             "tokens": data.num_tokens, "sources": data.num_articles,
                                             "beyond_window_share": round(share, 4)}
        assert data.embeddings.shape == (data.num_sentences, 384) and data.embeddings.dtype == np.float32
        assert isinstance(data.embeddings, np.memmap)
        for name in ARRAYS:
            assert manifest["hashes"][f"{split}/{name}.npy"] == file_sha256(data.path / f"{name}.npy")
    # Skips, recounted: the offline articles are all valid; in their seeded order, every article of fewer than
    # 2 sentences before the 30th usable one is skipped (and nothing after it is read).
    from planlm.data.corpus import Skips, read_articles

    short_ones, usable = 0, 0
    wiki = CorpusConfig(source="wiki-offline", num_train=24, num_validation=3, num_test=3)
    for article in read_articles(wiki, Skips()):
        if len(split_sentences([article["text"]])[0]) < 2:
            short_ones += 1
        else:
            usable += 1
            if usable == 30:
                break
    assert manifest["skipped"] == ({"too_few_sentences": short_ones} if short_ones else {})
    ids = [a["id"] for split in SPLITS for a in ds[split].articles]
    assert len(ids) == len(set(ids)) == 30


def test_sentences_keep_spacy_offsets(wiki_slice):
    ds = PreparedDataset(wiki_slice)
    for split in SPLITS:
        data = ds[split]
        texts = [a["text"] for a in data.articles]
        for article, spans in enumerate(split_sentences(texts)):
            assert len(spans) >= 2  # min_sentences
            got = [data.sentence_text(s) for s in data.sentence_range(article)]
            assert got == [texts[article][start:end] for start, end in spans]


def test_tokens_reproduce_articles_and_follow_the_anchor_convention(wiki_slice):
    ds = PreparedDataset(wiki_slice)
    tok = load_tokenizer("gpt2")
    for split in SPLITS:
        data = ds[split]
        for article in range(data.num_articles):
            tokens = data.token_range(article)
            assert tok.decode(data.input_ids[tokens.start:tokens.stop]) == data.articles[article]["text"]
            sentence = data.token_sentence[tokens.start:tokens.stop]
            assert sentence[0] == data.sentence_range(article).start
            assert sentence[-1] == data.sentence_range(article).stop - 1
            assert np.all(np.diff(sentence) >= 0) and np.all(np.diff(sentence) <= 1)
            plan = data.token_plan_sentence[tokens.start:tokens.stop]
            ends = np.flatnonzero(np.diff(sentence) == 1)  # last token of a sentence, not of the article
            assert np.array_equal(plan[ends], sentence[ends] + 1)
            others = np.setdiff1d(np.arange(len(sentence)), ends)
            assert np.array_equal(plan[others], sentence[others])
        assert np.array_equal(data.token_actions, np.asarray(data.actions)[data.token_plan_sentence])


def test_actions_are_nearest_centroids_and_embeddings_match_encoder(wiki_slice):
    ds = PreparedDataset(wiki_slice)
    codebook = ds.codebook.numpy()
    encoder = load_sentence_encoder("all-MiniLM-L6-v2")
    for split in SPLITS:
        data = ds[split]
        emb = np.asarray(data.embeddings)
        distances = ((emb[:, None, :] - codebook[None]) ** 2).sum(-1)  # (N, A)
        assert np.array_equal(np.asarray(data.actions), distances.argmin(1))
    data = ds["validation"]
    texts = [data.sentence_text(s) for s in range(data.num_sentences)]
    np.testing.assert_allclose(np.asarray(data.embeddings), encoder.encode(texts), atol=1e-4)


def test_faiss_agrees_with_sklearn_on_clustered_data():
    from sklearn.metrics import adjusted_rand_score

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(6, 8)) * 6
    truth = rng.integers(6, size=600)
    x = (centers[truth] + rng.normal(size=(600, 8))).astype(np.float32)
    results = {}
    for backend in ("faiss", "sklearn"):
        config = ActionsConfig(num_actions=6, backend=backend)
        codebook = fit_codebook(x, config, progress=False)
        labels = assign_actions(x, codebook, progress=False)
        assert adjusted_rand_score(truth, labels) == 1.0
        results[backend] = inertia(x, codebook, labels)
    assert results["faiss"] <= 1.01 * results["sklearn"]
    sampled = fit_codebook(x, ActionsConfig(num_actions=6, fit_sample=120, seed=1), progress=False)
    assert adjusted_rand_score(truth, assign_actions(x, sampled, progress=False)) == 1.0
    again = fit_codebook(x, ActionsConfig(num_actions=6, fit_sample=120, seed=1), progress=False)
    assert np.array_equal(sampled, again)  # seeded
    with pytest.raises(PlanlmError, match="num_actions \\(601\\) is larger than the number of training sentences"):
        fit_codebook(x, ActionsConfig(num_actions=601), progress=False)


class CountingEncoder:
    """The real MiniLM encoder, counting encode calls and failing after ``fail_after`` of them."""

    def __init__(self, fail_after: int | None = None):
        self.model = load_sentence_encoder("all-MiniLM-L6-v2")
        self.calls = 0
        self.fail_after = fail_after

    def get_embedding_dimension(self):
        return self.model.get_embedding_dimension()

    @property
    def device(self):
        return self.model.device

    def encode(self, texts, **kwargs):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.model.encode(texts, **kwargs)


def test_embedding_resumes_after_an_interrupt(tmp_path, monkeypatch, small_chunks):
    texts = SENTENCES * 2  # 16 sentences, 4 chunks of 4, one encode call per chunk
    config = EmbedConfig(batch_size=1)
    broken = CountingEncoder(fail_after=2)  # dies in chunk 3
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: broken)
    with pytest.raises(KeyboardInterrupt):
        embed_sentences(texts, tmp_path / "e.npy", config)
    assert json.loads((tmp_path / "e.npy.progress.json").read_text())["done"] == 2
    resumed = CountingEncoder()
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: resumed)
    out = embed_sentences(texts, tmp_path / "e.npy", config)
    assert resumed.calls == 2  # chunks 3 and 4 only
    np.testing.assert_allclose(out, resumed.model.encode(texts), atol=1e-4)
    # complete file: nothing is encoded again; other texts start over
    assert embed_sentences(texts, tmp_path / "e.npy", config) is not None and resumed.calls == 2
    embed_sentences(texts[:6], tmp_path / "e.npy", config)
    assert resumed.calls == 2 + 2 and np.load(tmp_path / "e.npy").shape == (6, 384)


def test_prepare_interrupted_while_tokenizing_resumes_after_its_last_batch_to_the_same_files(tmp_path, monkeypatch):
    """A build stopped while tokenising keeps its embeddings, its k-means fit and the batches it tokenised; the
    rerun fits nothing and tokenises only the rest, and every file equals an uninterrupted build's."""
    import planlm.data.prepare as prepare_module

    source = tiny_jsonl(tmp_path / "c.jsonl", num_articles=14)
    monkeypatch.setattr(prepare_module, "TOKENIZE_BATCH", 3)
    clean = prepare(str(tmp_path / "clean"), **tiny_config(source))
    train_articles = read_manifest(clean)["counts"]["train"]["articles"]
    assert train_articles > 6  # the interrupt below falls inside the training split
    tokenized, real = [], prepare_module.tokenize_articles

    def interrupted_after(batches):
        def tokenize(tokenizer, texts, spans):
            if batches is not None and len(tokenized) >= batches:
                raise KeyboardInterrupt
            tokenized.append(len(texts))
            return real(tokenizer, texts, spans)
        return tokenize

    out = tmp_path / "out"
    monkeypatch.setattr(prepare_module, "tokenize_articles", interrupted_after(2))
    with pytest.raises(KeyboardInterrupt):
        prepare(str(out), **tiny_config(source))
    assert not (out / "manifest.json").exists()
    assert json.loads((out / "train" / "tokens.progress.json").read_text())["articles"] == 6

    fits = []
    monkeypatch.setattr(prepare_module, "fit_codebook", lambda *args, **kwargs: fits.append(args))
    monkeypatch.setattr(prepare_module, "tokenize_articles", interrupted_after(None))
    tokenized.clear()
    prepare(str(out), **tiny_config(source))
    assert not fits  # the interrupted build's k-means fit is reused
    assert sum(tokenized) == train_articles - 6 + 2 + 2  # the rest of train, then validation and test
    files = sorted(p.relative_to(clean) for p in clean.rglob("*") if p.is_file())
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == files
    for name in files:
        if name.name != "manifest.json":
            assert (out / name).read_bytes() == (clean / name).read_bytes(), name
    drop = ("wall_time_s", "created", "finished")
    manifests = [{k: v for k, v in read_manifest(d).items() if k not in drop} for d in (clean, out)]
    assert manifests[0]["hashes"] == manifests[1]["hashes"]


@pytest.mark.skipif(not cpu_supports_bf16(), reason="this CPU has no native bf16")
def test_bf16_embeddings_match_fp32_and_are_not_resumed_across_precisions(tmp_path, monkeypatch):
    monkeypatch.setattr("planlm.data.embed.CHUNK_SIZE", 8)
    texts = SENTENCES * 2
    single = embed_sentences(texts, tmp_path / "e.npy", EmbedConfig(), progress=False).copy()
    counted = CountingEncoder()
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: counted)
    half = embed_sentences(texts, tmp_path / "e.npy", EmbedConfig(precision="bf16"), progress=False)
    assert counted.calls == 2 and half.dtype == np.float32  # encoded again (another fingerprint), stored in fp32
    cosine = (single * half).sum(1) / np.linalg.norm(single, axis=1) / np.linalg.norm(half, axis=1)
    assert cosine.min() > 0.999 and np.abs(single - half).max() > 0  # measured: 0.99998 on the demo's sentences
    with pytest.raises(PlanlmError, match="embedding.precision 'fp16'"):
        EmbedConfig(precision="fp16")


def test_bf16_embeddings_on_a_cpu_without_bf16_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setattr("planlm.device.cpu_supports_bf16", lambda: False)
    with pytest.raises(PlanlmError, match=r"--embedding.precision bf16: this CPU has no native bf16 .*use fp32"):
        embed_sentences(SENTENCES, tmp_path / "e.npy", EmbedConfig(precision="bf16"), progress=False)
    assert not (tmp_path / "e.npy").exists()  # nothing half-written


@pytest.mark.parametrize("native", [False, True])
def test_native_precision_is_bf16_where_the_cpu_has_it_and_fp32_elsewhere(tmp_path, monkeypatch, native):
    """The demo's `precision: native` runs on every machine: bf16 where it is native, fp32 (never refused) elsewhere."""
    from planlm.args import Runtime

    monkeypatch.setattr("planlm.device.cpu_supports_bf16", lambda: native)
    assert Runtime(precision="native", device="cpu").lightning_precision() == ("bf16-mixed" if native else "32-true")
    asked = []
    monkeypatch.setattr("planlm.data.embed.check_bf16", lambda precision, *a: asked.append(precision))
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: CountingEncoder())
    embed_sentences(SENTENCES, tmp_path / "e.npy", EmbedConfig(precision="native", device="cpu"), progress=False)
    assert asked == ["bf16" if native else "fp32"]


@pytest.mark.slow
def test_multi_process_pool_matches_single_process(tmp_path, monkeypatch):
    """The multi-GPU route (sentence-transformers' multi-process pool, taken with several CUDA devices), exercised
    with two CPU workers."""
    from planlm.data import embed

    monkeypatch.setattr(embed, "CHUNK_SIZE", 10)
    texts = SENTENCES * 3
    single = embed_sentences(texts, tmp_path / "one.npy", EmbedConfig(), progress=False)
    monkeypatch.setattr(embed, "_target_devices", lambda config: ["cpu", "cpu"])
    pooled = embed_sentences(texts, tmp_path / "pool.npy", EmbedConfig(), progress=False)
    np.testing.assert_allclose(np.asarray(pooled), np.asarray(single), atol=1e-4)
    if cpu_supports_bf16():  # bf16 in the pool: the weights are cast (autocast does not reach the processes)
        half = embed_sentences(texts, tmp_path / "half.npy", EmbedConfig(precision="bf16"), progress=False)
        cosine = (single * half).sum(1) / np.linalg.norm(single, axis=1) / np.linalg.norm(half, axis=1)
        assert half.dtype == np.float32 and cosine.min() > 0.99
        encoder = load_sentence_encoder(EmbedConfig().encoder, None)  # the instance embed_sentences got: not cast
        assert all(p.dtype == torch.float32 for p in encoder.parameters())


def test_reuse_rebuild_and_interrupted_runs(tmp_path, monkeypatch, small_chunks):
    source = tiny_jsonl(tmp_path / "c.jsonl")
    out = tmp_path / "prepared"
    prepare(str(out), **tiny_config(source))
    files = sorted(p for p in out.rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in files}

    # same config: reused, nothing recomputed or rewritten
    monkeypatch.setattr("planlm.data.prepare.draw_articles", lambda *a, **k: pytest.fail("recomputed"))
    assert prepare(str(out), **{**tiny_config(source), "embedding": EmbedConfig(batch_size=7)}) == out
    assert {p: p.stat().st_mtime_ns for p in files} == stamps
    monkeypatch.undo()

    # changed k-means config: rebuilt, the embeddings are resumed (not re-encoded)
    encoder = CountingEncoder()
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: encoder)
    prepare(str(out), **tiny_config(source, num_actions=2))
    assert PreparedDataset(out).num_actions == 2 and tuple(PreparedDataset(out).codebook.shape) == (2, 384)
    assert encoder.calls == 0
    assert (out / "train" / "embeddings.npy").stat().st_mtime_ns == stamps[out / "train" / "embeddings.npy"]

    # interrupted after embedding: no manifest, not complete, not loadable; the rerun completes
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    config = {**tiny_config(source), "corpus": CorpusConfig(source=str(source), num_validation=2, num_test=2, seed=1)}
    monkeypatch.setattr("planlm.data.prepare.fit_codebook", interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(out), **config)
    assert read_manifest(out) is None
    with pytest.raises(PlanlmError, match="manifest.json missing"):
        PreparedDataset(out)
    calls_after_interrupt = encoder.calls
    assert calls_after_interrupt > 0  # another draw of the articles: other sentences, re-encoded
    monkeypatch.undo()
    monkeypatch.setattr("planlm.data.embed.CHUNK_SIZE", 4)
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: encoder)
    prepare(str(out), **config)
    assert encoder.calls == calls_after_interrupt  # resumed from the finished embedding files
    assert np.asarray(PreparedDataset(out)["train"].embeddings).shape[1] == 384


def test_each_file_is_hashed_once_and_the_manifest_hashes_are_its_file_records(tmp_path, monkeypatch):
    """prepare reads each file it wrote once to hash it: the manifest's ``hashes`` come from its ``files`` record."""
    hashed = []
    for name, module in list(sys.modules.items()):  # every planlm module's name for the one function
        if name.startswith("planlm") and hasattr(module, "file_sha256"):
            monkeypatch.setattr(module, "file_sha256", lambda path, *a, _real=module.file_sha256, **k:
                                hashed.append(Path(path).resolve()) or _real(path, *a, **k))
    out = prepare(str(tmp_path / "prepared"), **tiny_config(tiny_jsonl(tmp_path / "c.jsonl")))
    manifest = read_manifest(out)
    assert len(hashed) == len(set(hashed)) == len(manifest["files"])
    assert len(manifest["hashes"]) == 1 + len(SPLITS) * (1 + len(ARRAYS))  # the codebook, each split's files
    assert all(manifest["files"][name]["sha256"] == digest for name, digest in manifest["hashes"].items())


def test_bad_inputs(tmp_path):
    source = tiny_jsonl(tmp_path / "c.jsonl")
    with open(source, "ab") as f:
        f.write(b'{"id": "broken"\n{"id": "t1", "text": "A duplicate. Of an id."}\n{"id": "e", "text": " "}\n'
                b'{"id": "one", "text": "Just one sentence."}\n{"id": "x", "text": "Bad \xff byte. Here."}\n')
    out = prepare(str(tmp_path / "ok"), **tiny_config(source))
    assert read_manifest(out)["skipped"] == {"malformed_json": 1, "duplicate_id": 1, "empty_text": 1,
                                             "too_few_sentences": 1, "undecodable": 1}

    strict = tiny_config(source)
    strict["corpus"] = CorpusConfig(source=str(source), num_validation=2, num_test=2, on_bad_record="error")
    with pytest.raises(PlanlmError, match=f"{source} line 11 .*: malformed json; fix or delete that line"):
        prepare(str(tmp_path / "strict"), **strict)
    assert read_manifest(tmp_path / "strict") is None

    with pytest.raises(PlanlmError, match="num_actions \\(500\\) is larger than the number of training sentences "
                                          "\\(24\\); lower --actions.num_actions"):
        prepare(str(tmp_path / "many"), **tiny_config(source, num_actions=500))
    assert not is_complete(tmp_path / "many", {}) and not (tmp_path / "many" / "train").exists()


def test_articles_with_fewer_than_min_sentences_are_counted_skips(tmp_path):
    source = tiny_jsonl(tmp_path / "c.jsonl")  # ten articles of 4 sentences
    with open(source, "a") as f:
        f.write(json.dumps({"id": "two", "text": "Only two sentences. Here they end."}) + "\n")

    def drawn_ids(min_sentences: int, skips: Skips) -> set[str]:
        corpus = CorpusConfig(source=str(source), num_validation=2, num_test=2, min_sentences=min_sentences)
        drawn = take_articles(corpus, SentencesConfig(), skips, progress=False)
        return {a["id"] for split in drawn.values() for a in split[0]}

    skips = Skips()
    assert "two" in drawn_ids(2, skips) and len(drawn_ids(2, Skips())) == 11 and not skips
    assert drawn_ids(3, skips) == {f"t{i}" for i in range(10)} and skips == {"too_few_sentences": 1}
    with pytest.raises(PlanlmError, match="only 0 usable articles \\(with >= 5 sentences\\)"):
        drawn_ids(5, Skips())
    with pytest.raises(PlanlmError, match="--corpus.min_sentences must be >= 1 \\(got 0\\)"):
        CorpusConfig(min_sentences=0)


def test_cli_help_print_config_and_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["prepare", "--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--corpus.source", "--corpus.num_test", "--embedding.encoder", "--actions.num_actions",
                 "--actions.backend", "--tokenizer", "Turn a corpus into sentences"):
        assert flag in help_text

    with pytest.raises(SystemExit) as e:
        cli_main(["prepare", "--print_config"])
    assert e.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["actions"]["num_actions"] == ActionsConfig().num_actions
    assert printed["corpus"]["source"] == "sotu" and printed["corpus"]["piece_sentences"] == 30

    source = tiny_jsonl(tmp_path / "c.jsonl")
    printed.update(out_dir=str(tmp_path / "cli"))
    printed["corpus"].update(source=str(source), num_validation=2, num_test=2)
    printed["actions"]["num_actions"] = 3
    (tmp_path / "prepare.yaml").write_text(yaml.safe_dump(printed))
    cli_main(["prepare", "--config", str(tmp_path / "prepare.yaml")])
    assert "planlm prepare: wrote" in capsys.readouterr().out
    assert PreparedDataset(tmp_path / "cli").num_actions == 3

    with pytest.raises(SystemExit) as e:
        cli_main(["prepare", "--config", str(tmp_path / "prepare.yaml"), "--out_dir", str(tmp_path / "bad"),
                  "--actions.num_actions", "500"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("planlm: error: --actions.num_actions (500)") and "\n" not in err


@pytest.mark.parametrize("setting, column", [("text_column", "body"), ("id_column", "doc_id")])
def test_a_column_that_no_record_has_is_one_line_error_before_any_artifact(tmp_path, capsys, setting, column):
    source = tiny_jsonl(tmp_path / "data.jsonl")
    out = tmp_path / "prepared"
    with pytest.raises(SystemExit) as e:
        cli_main(["prepare", "--out_dir", str(out), "--corpus.source", str(source), f"--corpus.{setting}", column,
                  "--corpus.num_validation", "2", "--corpus.num_test", "2", "--actions.num_actions", "3"])
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (f"planlm: error: {source}: no column {column!r} in its records (they have: id, "
                                    f"text, title); set --corpus.{setting} to one of them")
    assert "skipping" not in captured.out + captured.err
    assert read_manifest(out) is None and not [p for p in out.rglob("*") if p.is_file()]


# ---------------------------------------------------------------- token -> sentence -> plan, by hand

HAND_TEXTS = ["Red blue. Water fire! Gold.", "Black white.  Gold"]
HAND_SPANS = [[(0, 9), (10, 21), (22, 27)], [(0, 12), (14, 18)]]  # [start, end) of each sentence


def test_tokens_belong_to_the_sentence_of_their_last_character():
    from planlm.data.tokens import assign_tokens_to_sentences, tokenize_articles

    # "Red blue. Water fire! Gold." as GPT-2 cuts it: a sentence's period ends it, the next word's
    # leading space belongs to the next sentence.
    token_spans = np.array([(0, 3), (3, 8), (8, 9), (9, 15), (15, 20), (20, 21), (21, 26), (26, 27)])
    assert assign_tokens_to_sentences(token_spans, np.array(HAND_SPANS[0])).tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    # A whitespace token in the gap goes to the next sentence, a zero-width token to the sentence at its
    # position, a token past the last sentence (and one straddling the end) to the last sentence.
    spans = np.array([(0, 4), (6, 10)])
    odd_tokens = np.array([(0, 0), (0, 4), (4, 6), (6, 10), (9, 12), (10, 11)])
    assert assign_tokens_to_sentences(odd_tokens, spans).tolist() == [0, 0, 1, 1, 1, 1]
    # The real tokenizer on whole articles gives the same mapping.
    tok = load_tokenizer("gpt2")
    ids, token_sentence = tokenize_articles(tok, HAND_TEXTS, [np.array(s) for s in HAND_SPANS])
    assert [tok.decode([i]) for i in ids[0]] == ["Red", " blue", ".", " Water", " fire", "!", " Gold", "."]
    assert token_sentence[0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [tok.decode([i]) for i in ids[1]] == ["Black", " white", ".", " ", " Gold"]  # a gap of two spaces
    assert token_sentence[1].tolist() == [0, 0, 0, 1, 1]


def test_the_last_token_of_a_sentence_carries_the_next_sentences_plan(tmp_path):
    """The ANCHORS shift, from prepared arrays through a training batch to the LM's input embeddings."""
    from planlm.data.artifacts import PreparedSplit, token_plan_sentence, write_split
    from planlm.data.windows import collate_windows
    from planlm.plans.sources import OraclePlans

    # two articles: sentences 0-2 (8 tokens) and 3-4 (3 tokens); split-global sentence of each token
    token_sentence = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4])
    token_offsets = np.array([0, 8, 11])
    plan = token_plan_sentence(token_sentence, token_offsets)
    # the period (2, 5) and the article's ninth token (9) move on; an article's last token (7, 10) does not
    assert plan.tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 3, 4, 4]
    actions = np.array([5, 6, 7, 1, 2])
    write_split(tmp_path / "split", [{"id": "a", "text": HAND_TEXTS[0]}, {"id": "b", "text": "Black. White"}], {
        "sentence_offsets": np.array([0, 3, 5]), "sentence_spans": np.array(HAND_SPANS[0] + [(0, 6), (7, 12)]),
        "embeddings": np.zeros((5, 4)), "actions": actions, "token_offsets": token_offsets,
        "input_ids": np.arange(100, 111), "token_sentence": token_sentence})
    split = PreparedSplit(tmp_path / "split")
    assert np.array_equal(split.token_plan_sentence, plan) and np.array_equal(split.token_actions, actions[plan])
    batch = collate_windows(split, [(0, 0, 8), (1, 8, 11)], OraclePlans(split, num_paths=2, horizon=2))
    # the first step of the path conditioning each token is the action of its plan sentence; the second
    # is the next sentence's, masked past the article's end
    first_steps = batch["action_paths"][batch["plan_index"], 0, 0]  # (B, L)
    assert first_steps[0].tolist() == [5, 5, 6, 6, 6, 7, 7, 7] and first_steps[1, :3].tolist() == [1, 2, 2]
    assert (batch["plan_index"][1, 3:] == -1).all()
    second_valid = batch["path_mask"][batch["plan_index"][0], 0, 1]  # (L,) sentence 2 has no successor
    assert second_valid.tolist() == [True, True, True, True, True, False, False, False]
    # PlannedLM adds plan vector plan_index[t] to token t's embedding (nothing where plan_index is -1)
    from helpers import tiny_gpt2

    from planlm.models.adapter import AdapterConfig
    from planlm.models.planned_lm import PlannedLM, PlannedLMConfig
    from planlm.plans.config import PlanConfig

    adapter = AdapterConfig(num_actions=8, action_dim=4, hidden_size=32)
    model = PlannedLM(PlannedLMConfig(plans=PlanConfig(kind="oracle", num_paths=2, horizon=2), adapter=adapter, num_actions=8),
                      tiny_gpt2(), None).eval()
    model.adapter.projection.reset_parameters()  # W and b at PyTorch's init, not the no-op zero
    input_ids = torch.randint(0, 1000, batch["input_ids"].shape)
    with torch.no_grad():
        got = model(input_ids, action_paths=batch["action_paths"], path_mask=batch["path_mask"],
                    plan_index=batch["plan_index"]).logits
        vectors = model.plan_vectors(batch["action_paths"], batch["path_mask"])  # (N, D)
        embeds = model.lm.get_input_embeddings()(input_ids).clone()
        for row in range(2):
            for t in range(embeds.shape[1]):
                if batch["plan_index"][row, t] >= 0:
                    embeds[row, t] += vectors[batch["plan_index"][row, t]]
        expected = model.lm(inputs_embeds=embeds).logits
    torch.testing.assert_close(got, expected)


def test_the_summary_states_the_share_beyond_the_window_and_warns_without_long_documents(tmp_path, capsys):
    source = tiny_jsonl(tmp_path / "c.jsonl")
    long_documents = CorpusConfig(source=str(source), num_validation=2, num_test=2, piece_sentences=30)
    out = prepare(str(tmp_path / "short"), **{**tiny_config(source), "corpus": long_documents})
    printed = capsys.readouterr()
    share = PreparedDataset(out).manifest["counts"]["train"]["beyond_window_share"]
    assert share == 0.0 and "0.0% beyond the 128-token window" in printed.out
    assert "warning: only 0.0% of the training tokens have context beyond the 128-token LM window" in printed.err


def test_a_bpe_tokenizer_trained_on_the_training_split_is_saved_and_used_downstream(tmp_path):
    from helpers import tiny_gpt2_config

    from planlm.models.planned_lm import PlannedLM
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    out = prepare(str(tmp_path / "prepared"), **tiny_config(tiny_jsonl(tmp_path / "c.jsonl")), tokenizer="bpe:300")
    ds = PreparedDataset(out)
    assert ds.tokenizer_name == str((out / "tokenizer").resolve())
    assert ds.manifest["config"]["tokenizer"] == "bpe:300"  # the spec is the fingerprint, the folder the result
    tok = load_tokenizer(ds.tokenizer_name)
    assert len(tok) == 300 and tok.is_fast and tok.eos_token == "<|endoftext|>"
    train = ds["train"]
    for article in range(train.num_articles):  # the tokens spell each article, and the train text made the merges
        assert tok.decode(train.input_ids[train.token_range(article)]) == train.articles[article]["text"]
    assert len(tok("Café ☃")["input_ids"]) > 0  # unseen characters still tokenize (the byte alphabet)
    model = train_lm(str(out), str(tmp_path / "lm"), model=LMModelConfig(model_config=tiny_gpt2_config()),
                     train=LMTrainConfig(batch_size=4, max_epochs=1, limit_train_batches=2, limit_val_batches=1))
    lm = PlannedLM.from_pretrained(model).base_lm()
    assert lm.get_input_embeddings().num_embeddings == 300 and lm.config.eos_token_id == tok.eos_token_id < 300
    for bad in ("bpe:100", "bpe:many"):
        with pytest.raises(PlanlmError, match=r"a trained tokenizer is bpe:V with V > 256"):
            prepare(str(tmp_path / "bad"), **tiny_config(tiny_jsonl(tmp_path / "c.jsonl")), tokenizer=bad)
