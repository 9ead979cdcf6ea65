"""The report's corpus line: the share of the evaluated tokens with context beyond the LM's window."""

from __future__ import annotations

import json

import numpy as np

from planlm.pipeline.layout import RunLayout
from planlm.pipeline.report import write_report


def test_the_report_states_the_share_of_tokens_beyond_the_window(tmp_path):
    layout = RunLayout(tmp_path / "run")
    (layout.prepared / "test").mkdir(parents=True)
    np.save(layout.prepared / "test" / "token_offsets.npy", np.array([0, 100, 400, 1000]))
    evaluation = layout.evaluation("none")
    evaluation.mkdir(parents=True)
    (evaluation / "metrics.json").write_text(json.dumps({"ppl": 50.0, "tokens": 398, "articles": 2}))
    (evaluation / "manifest.json").write_text(json.dumps({"config": {"split": "test", "context_length": 128,
                                                                     "articles": 2}}))
    text = write_report(layout.root, conditions=[{"name": "none"}]).read_text()
    # the 2 evaluated articles (100 and 300 tokens): 172 of 400 tokens lie beyond a 128-token window
    assert "Corpus: 2 test articles, median 200 tokens, read through a 128-token window: **43.0% of their tokens" \
        in text
