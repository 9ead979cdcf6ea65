import numpy as np
import pytest

from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.evaluate.edit_distance import (_distance_summary, action_edit_distance, edit_distance, nearest_actions,
                                           select_boundaries, text_actions)
from planlm.evaluate.generate import synthetic_embed_fn
from planlm.evaluate.metrics import EditDistanceMetrics

from helpers import chatty_planned_lm, read_csv


def dynamic_programming_levenshtein(a, b):
    table = np.zeros((len(a) + 1, len(b) + 1), dtype=int)
    table[:, 0], table[0, :] = np.arange(len(a) + 1), np.arange(len(b) + 1)
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i, j] = min(table[i - 1, j] + 1, table[i, j - 1] + 1, table[i - 1, j - 1] + (a[i - 1] != b[j - 1]))
    return int(table[-1, -1])


@pytest.mark.parametrize("generated, reference, distance, normalized", [
    ([3, 7, 1], [3, 7, 1], 0, 0.0),
    ([3, 7, 1], [3, 1], 1, 0.5),          # one insertion
    ([3, 7, 1], [3, 5, 1], 1, 1 / 3),     # one substitution
    ([1, 2], [2, 1], 2, 1.0),             # a swap costs two (Levenshtein, not Damerau)
    ([], [4, 4], 2, 1.0),                 # nothing generated
    ([4, 4, 4], [], 3, 3.0),              # an empty reference counts as length 1
    ([1000, 1023], [1000, 1023, 12], 1, 1 / 3),  # action ids beyond a byte
])
def test_edit_distance_of_hand_made_action_sequences(generated, reference, distance, normalized):
    assert action_edit_distance(generated, reference) == (distance, pytest.approx(normalized))


def test_edit_distance_matches_dynamic_programming_on_random_sequences():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.integers(0, 6, size=rng.integers(0, 9)).tolist()
        b = rng.integers(0, 6, size=rng.integers(0, 9)).tolist()
        assert action_edit_distance(a, b)[0] == dynamic_programming_levenshtein(a, b)


def test_texts_become_the_action_sequences_of_their_sentences(synthetic_cycle):
    prepared = PreparedDataset(synthetic_cycle)
    codebook = prepared.codebook.numpy()
    assert np.array_equal(nearest_actions(codebook[[5, 2, 2]] + 0.01, codebook), [5, 2, 2])
    # synthetic wording: red/blue/green belong to action 0, black/white/gold to 1, water/fire/river to 2
    texts = [" Red blue. White gold gold. Water fire", "Black.", ""]
    assert text_actions(texts, synthetic_embed_fn(prepared), codebook) == [[0, 1, 2], [1], []]


def test_boundaries_skip_article_starts_and_subsample_reproducibly():
    offsets = np.array([0, 1, 6, 9])
    every = select_boundaries(offsets, 3, None, seed=0)
    assert every == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2)]
    some = select_boundaries(offsets, 3, 2, seed=1)
    assert len(some) == 4 and set(some) <= set(every) and some == select_boundaries(offsets, 3, 2, seed=1)


def test_edit_distance_command_scores_true_reference_actions(synthetic_cycle, tmp_path):
    from planlm.cli import main

    prepared = PreparedDataset(synthetic_cycle)
    model_dir = tmp_path / "model"
    chatty_planned_lm(prepared).save_pretrained(model_dir)
    out = tmp_path / "edit"
    main(["edit-distance", "--model_dir", str(model_dir), "--prepared_dir", str(synthetic_cycle), "--out_dir", str(out),
          "--plans.kind", "fixed", "--max_articles", "3", "--max_boundaries_per_article", "1",
          "--sampling.max_new_tokens", "12",
          "--bootstrap_samples", "50", "--runtime.device", "cpu"])
    metrics = EditDistanceMetrics.load(out)
    rows = read_csv(out / "per_boundary.csv")
    assert len(rows) == metrics.boundaries == 3 and metrics.conditioning == "fixed"
    test = prepared["test"]
    for row in rows:
        article, boundary = int(row["article"]), int(row["boundary"])
        assert boundary >= 1
        reference = [int(a) for a in row["reference_actions"].split()]
        first = test.sentence_range(article).start + boundary
        # 12 true tokens cover the first sentences from the boundary on: their true actions, in order
        assert reference == [int(a) for a in test.actions[first:first + len(reference)]] and reference
        generated = [int(a) for a in row["generated_actions"].split()]
        assert int(row["distance"]) == action_edit_distance(generated, reference)[0]
        assert set(generated) <= {0, 2}  # the chatty LM writes "red" (action 0) and "water" (action 2)
    distances = [int(r["distance"]) for r in rows]
    assert metrics.edit_distance == pytest.approx(np.mean(distances))
    assert metrics.ci_low <= metrics.edit_distance <= metrics.ci_high
    assert metrics.tokens_per_s > 0 and metrics.generated_tokens == 36
    with pytest.raises(PlanlmError, match="max_boundaries_per_article"):
        edit_distance(str(model_dir), str(synthetic_cycle), str(tmp_path / "x"), max_boundaries_per_article=0)


def test_the_interval_resamples_source_documents_with_all_their_boundaries():
    """Six documents of five boundaries each, the boundaries of a document alike: the interval is the documents'
    (about sqrt(5) wider than one that resamples boundaries as if each were a document of its own)."""
    rng = np.random.default_rng(0)
    effects = rng.normal(3.0, 1.0, size=6)
    rows, sources = [], []
    for doc, effect in enumerate(effects):
        for piece in range(5):
            value = effect + rng.normal(0, 0.01)
            rows.append({"distance": value, "normalized": value / 10})
            sources.append(f"speech{doc}")  # the pieces "speech{doc}#{piece}" of one document
    summary = _distance_summary(rows, 4000, 0.95, 0, sources)
    width = summary["ci_high"] - summary["ci_low"]
    document_means = np.array([np.mean([r["distance"] for r in rows[5 * d:5 * d + 5]]) for d in range(6)])
    expected = 2 * 1.96 * document_means.std() / np.sqrt(6)  # the bootstrap's standard error over 6 documents
    assert 0.75 * expected < width < 1.25 * expected
    alone = _distance_summary(rows, 4000, 0.95, 0, [f"b{i}" for i in range(30)])
    assert width > 1.8 * (alone["ci_high"] - alone["ci_low"])
    assert summary["normalized_ci_high"] - summary["normalized_ci_low"] == pytest.approx(width / 10, rel=1e-9)
