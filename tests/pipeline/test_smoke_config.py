"""configs/smoke.yaml: every stage on a tiny slice of the embedded corpus, and as an overlay on a user's own small
corpus; `--dry_run true` checks a local corpus (it exists, its first records hold the text column)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from planlm.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.yaml"
WORDS = ("the planner reads every sentence before a boundary and predicts the next writing actions while the "
         "language model reads a short window of tokens and the adapter adds the plans to its inputs").split()


def write_corpus(path: Path, documents: int = 40, text_key: str = "text") -> Path:
    """A JSONL corpus of ``documents`` made-up articles of 6-12 sentences each, as a user's own small corpus."""
    rng = random.Random(0)

    def sentence() -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(6, 14))).capitalize() + "."

    with open(path, "w") as f:
        for i in range(documents):
            text = " ".join(sentence() for _ in range(rng.randint(6, 12)))
            f.write(json.dumps({"id": f"doc{i}", text_key: text}) + "\n")
    return path


def dry_run(capsys, *args) -> tuple[int, str, str]:
    try:
        main(["run", "--config", str(SMOKE), *map(str, args), "--dry_run", "true"])
        code = 0
    except SystemExit as exited:
        code = exited.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_the_smoke_config_checks_on_its_slice_and_on_a_users_40_document_corpus(tmp_path, capsys):
    code, out, _ = dry_run(capsys, "--out_dir", tmp_path / "embedded")
    assert code == 0 and "config valid: 11 stages" in out
    corpus = write_corpus(tmp_path / "mine.jsonl")
    code, out, _ = dry_run(capsys, "--prepare.corpus.source", corpus, "--out_dir", tmp_path / "run")
    assert code == 0 and "config valid: 11 stages" in out
    for stage in ("prepare", "train-planner", "train-lm _base", "train-lm none", "evaluate fixed", "train-lm ours",
                  "evaluate oracle"):
        assert f". {stage}  ->" in out


def test_a_dry_run_names_a_corpus_file_that_is_not_there(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = dry_run(capsys, "--prepare.corpus.source", "my_articles.jsonl")
    assert code == 2
    assert err == (f"planlm: error: prepare.corpus.source my_articles.jsonl: no such file (from {tmp_path}); set it "
                   f"to the path of your corpus (a .jsonl, .parquet or .txt file, a folder of them or a glob), e.g. "
                   f"--prepare.corpus.source data/my_articles.jsonl")


def test_a_dry_run_names_the_record_without_the_text_column_and_the_fix(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "mine.jsonl", text_key="body")
    code, _, err = dry_run(capsys, "--prepare.corpus.source", corpus)
    assert code == 2
    assert err == (f"planlm: error: {corpus} line 1: no 'text' key (it has: id, body); set "
                   f"prepare.corpus.text_column to the key that holds the text (--prepare.corpus.text_column KEY)")
    code, out, _ = dry_run(capsys, "--prepare.corpus.source", corpus, "--prepare.corpus.text_column", "body",
                           "--out_dir", tmp_path / "run")
    assert code == 0 and "config valid" in out
    broken = tmp_path / "broken.jsonl"
    broken.write_text(corpus.read_text().replace('"id": "doc2"', '"id" "doc2"', 1))
    code, _, err = dry_run(capsys, "--prepare.corpus.source", broken, "--prepare.corpus.text_column", "body")
    assert code == 2 and err.startswith(f"planlm: error: {broken} line 3: not a JSON object (")


@pytest.mark.slow
def test_the_smoke_config_runs_every_stage_on_a_users_40_document_corpus(tmp_path):
    """The whole smoke run on a made-up 40-document corpus (a few minutes on a loaded 2-core machine)."""
    corpus, out = write_corpus(tmp_path / "mine.jsonl"), tmp_path / "run"
    main(["run", "--config", str(SMOKE), "--prepare.corpus.source", str(corpus), "--out_dir", str(out)])
    state = json.loads((out / "run_state.json").read_text())["stages"]
    assert len(state) == 11 and all(stage["status"] == "done" for stage in state.values())
    assert (out / "report.md").is_file()
