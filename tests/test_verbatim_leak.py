"""experiments/verbatim_leak.py: training-side pieces holding a verbatim run of a whole held-out document, on a
made-up prepared folder with known runs (one of them through a piece that no split kept). Seconds."""

from __future__ import annotations

import json

import pytest

from experiments import verbatim_leak

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`

WORDS = [f"w{i}" for i in range(400)]


def _text(start: int, stop: int) -> str:
    return " ".join(WORDS[start:stop])


def _folder(tmp_path, planner: bool):
    """Held out: documents A (test; its second half in a piece no split kept) and B (validation). Training side:
    a piece with 60 words of A's unkept half, one with 49 of B's (no run), one with 55 of B's [1]-marked."""
    held = {"A": _text(0, 200), "B": _text(200, 400)}
    splits = {"test": [{"id": "A#0", "source": "A", "text": _text(0, 100)}],
              "validation": [{"id": "B", "source": "B", "text": held["B"]}],
              "train": [{"id": "t#0", "source": "t", "text": "new words here " + _text(120, 180) + " and more"},
                        {"id": "t#1", "source": "t", "text": "x " + _text(250, 299) + " y"}]}
    if planner:
        marked = " ".join(w + (" [1]" if i % 6 == 5 else "") for i, w in enumerate(WORDS[300:355]))
        splits["planner_train"] = splits["train"] + [{"id": "u", "source": "u", "text": marked.upper()}]
    for split, articles in splits.items():
        (tmp_path / split).mkdir()
        (tmp_path / split / "articles.jsonl").write_text("".join(json.dumps(a) + "\n" for a in articles))
    (tmp_path / "manifest.json").write_text(json.dumps({"config": {"corpus": {}}, "skipped": {},
                                                        "held_out_overlap": {"verbatim": {"passages": 0}}}))
    return held


@pytest.mark.parametrize("planner", [False, True])
def test_the_runs_of_whole_held_out_documents_are_counted_per_set(tmp_path, planner, capsys):
    held = _folder(tmp_path, planner)
    result = verbatim_leak.measure(tmp_path, held_out_texts=held)
    assert result["sets"]["lm_train"] == {"pieces": 2, "with_run": 1, "ids": ["t#0"]}
    assert result["longest"][:2] == ([(55, "u", "B", "validation"), (60, "t#0", "A", "test")][::-1] if planner
                                     else [(60, "t#0", "A", "test"), (49, "t#1", "B", "validation")])
    if planner:
        assert result["sets"]["planner_train"]["with_run"] == result["sets"]["codebook"]["with_run"] == 2
    assert result["with_run"] == 1 + planner and result["prepare_dropped"] == {"passages": 0}
    assert verbatim_leak.measure(tmp_path, min_words=61, held_out_texts=held)["with_run"] == 0
    print(verbatim_leak.report(result))
    assert "| lm_train | 2 | 1 |" in capsys.readouterr().out


def test_the_run_finder_agrees_with_prepares_index():
    """The plain dictionary here and ``HeldOutIndex.compare`` find the same runs."""
    from planlm.data.held_out import HeldOutIndex
    index = HeldOutIndex()
    index.add("A", "test", _text(0, 200))
    finder = verbatim_leak.Runs({"A": ("test", _text(0, 200))})
    for text in (_text(10, 70), "a b " + _text(5, 56) + " c " + _text(100, 149), _text(0, 200) + " " + _text(0, 50)):
        mine = sorted(n for n, _ in finder.longest(text) if n >= 50)
        theirs = sorted(r.length for r in index.compare(text)[1])
        assert mine == theirs
