"""benchmarks/scale_sim.py: the paper-shaped corpus, the stand-in encoder, the report's arithmetic, and (slow) the whole
simulation at a tiny size through its main()."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_corpus_is_paper_shaped_and_deterministic(tmp_path):
    data = load("scale_sim_data")
    info = data.write_corpus(tmp_path / "a.jsonl", 400, seed=3)
    data.write_corpus(tmp_path / "b.jsonl", 400, seed=3)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    articles = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(articles) == info["articles"] == 400 and len({a["id"] for a in articles}) == 400
    assert 30 < info["mean_sentences"] < 40 and info["median_sentences"] < info["mean_sentences"]  # a long tail
    assert all(a["text"].strip() for a in articles)
    assert sum("\n\n" in a["text"] for a in articles) > 300  # paragraphs: runs of sentences of one source document
    counts = data.sentence_counts(200_000, np.random.default_rng(0))
    assert abs(counts.mean() - 35) < 0.5 and counts.min() >= 2


def test_the_stand_in_encoder_is_deterministic_and_keeps_the_interface():
    data = load("scale_sim_data")
    encoder = data.HashingEncoder(dim=32)
    texts = ["The river rises in the north.", "It flows south.", "", "The river rises in the north."]
    out = encoder.encode(texts, batch_size=2, show_progress_bar=False, normalize_embeddings=True, convert_to_numpy=True)
    assert out.shape == (4, 32) and out.dtype == np.float32 and encoder.get_embedding_dimension() == 32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1, rtol=1e-5)
    np.testing.assert_array_equal(out[0], out[3])
    np.testing.assert_array_equal(out, data.HashingEncoder(dim=32).encode(texts, normalize_embeddings=True))
    assert encoder.device.type == "cpu"


def test_growth_and_extrapolation_come_from_the_two_largest_sizes(tmp_path):
    sim = load("scale_sim")
    for size, wall, rss in ((100, 10.0, 500.0), (200, 15.0, 600.0), (400, 25.0, 800.0)):
        path = sim.record_path(tmp_path, size, "prepare")
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"stage": "prepare", "articles": size, "wall_s": wall, "cpu_s": wall,
                                    "peak_rss_mb": rss, "peak_anon_mb": rss / 2, "disk_mb": size / 10,
                                    "phases": [], "counts": {"splits": {"train": {"articles": size,
                                                                                   "sentences": 35 * size,
                                                                                   "tokens": 1050 * size}}}}))
    for size, wall in ((100, 40.0), (200, 80.0)):  # a stage not measured at the largest size: its own two largest
        sim.record_path(tmp_path, size, "sample-plans").write_text(json.dumps({
            "stage": "sample-plans", "articles": size, "wall_s": wall, "cpu_s": wall, "peak_rss_mb": 300.0,
            "peak_anon_mb": 100.0, "disk_mb": 1.0, "phases": [], "counts": {}}))
    results = sim.summarise(tmp_path, [100, 200, 400], [1000], sim.Settings())
    assert results["growth"]["sample-plans"]["from"] == 100 and results["growth"]["sample-plans"]["to"] == 200
    assert results["extrapolation"]["sample-plans"]["1000"]["wall_s"] == pytest.approx(400.0)
    assert (results["growth"]["prepare"]["from"], results["growth"]["prepare"]["to"]) == (200, 400)
    assert results["growth"]["prepare"]["rss_ratio"] == pytest.approx(800 / 600)
    assert results["growth"]["prepare"]["per_1k_articles"]["peak_rss_mb"] == pytest.approx(1000)
    at = results["extrapolation"]["prepare"]["1000"]
    assert at["wall_s"] == pytest.approx(55.0) and at["peak_rss_mb"] == pytest.approx(1400.0)
    assert sim.linear(10, 5, 100, 200, 1000) == 5  # a noisy decrease extrapolates flat
    assert "| prepare |" in results["report"] and "1,000 articles" in results["report"]
    assert "35.0 sentences and 1,050 tokens each" in results["report"]


@pytest.mark.slow
def test_the_simulation_runs_every_stage_at_a_tiny_size(tmp_path, capsys):
    sim = load("scale_sim")
    argv = ["--sizes", "30", "45", "--out_dir", str(tmp_path / "sim"), "--heldout", "3", "--num_actions", "8",
            "--embedding_dim", "16", "--planner_steps", "2", "--planner_batch_size", "64", "--lm_steps", "2",
            "--num_paths", "2", "--horizon", "3", "--eval_articles", "2", "--eval_stride", "127"]
    results = sim.main(argv)
    table = {(r["articles"], r["stage"]): r for r in results["records"]}
    assert set(table) == {(size, stage) for size in (30, 45) for stage in sim.STAGES}
    for record in table.values():
        assert record["wall_s"] > 0 and record["cpu_s"] > 0 and record["peak_rss_mb"] > 0
        assert record["peak_anon_mb"] > 0 and record["phases"]
    assert table[(45, "prepare")]["counts"]["splits"]["train"]["articles"] == 45
    assert table[(45, "sample-plans")]["counts"]["boundaries"]["train"] > table[(30, "sample-plans")]["counts"][
        "boundaries"]["train"]
    assert table[(45, "prepare")]["disk_mb"] > 0 and table[(45, "train-lm")]["counts"]["global_step"] == 2
    assert set(results["growth"]) == set(sim.STAGES) and set(results["extrapolation"]["evaluate"]) == {
        "285310", "6400000"}
    assert all(f"| {stage} |" in results["report"] for stage in sim.STAGES)
    assert (tmp_path / "sim" / "report.md").is_file()

    capsys.readouterr()
    again = sim.main(argv)  # resumable: every size and stage is measured already
    assert capsys.readouterr().out.count("measured already") == 2 * len(sim.STAGES)
    assert again["records"] == results["records"]
    with pytest.raises(SystemExit, match="other settings"):
        sim.main([*argv, "--num_actions", "9"])

    # a measurement of a resumable stage cut short (its attempt's figures so far on disk) is continued and added up
    records = tmp_path / "sim" / "n45" / "records"
    for stage in ("sample-plans", "train-lm", "evaluate"):
        (records / f"{stage}.json").unlink()
    (records / "sample-plans.attempts.json").write_text(json.dumps(
        [{"wall_s": 100.0, "cpu_s": 50.0, "peak_rss_mb": 1e6, "peak_anon_mb": 2.0}]))
    (tmp_path / "sim" / "n45" / "plans" / "manifest.json").unlink()  # as the killed stage left it
    continued = {(r["articles"], r["stage"]): r for r in sim.main(argv)["records"]}[(45, "sample-plans")]
    assert len(continued["attempts"]) == 2 and continued["wall_s"] > 100 and continued["cpu_s"] > 50
    assert continued["peak_rss_mb"] == 1e6 and not (records / "sample-plans.attempts.json").exists()


@pytest.mark.slow
def test_prepare_killed_in_embedding_and_in_tokenising_resumes_to_the_uninterrupted_folder(tmp_path):
    sim, resume = load("scale_sim"), load("scale_resume")
    out = tmp_path / "sim"
    # 600 articles: two embedding chunks of 8,192 sentences, two tokenising batches of 512 articles
    sim.main(["--articles", "600", "--out_dir", str(out), "--heldout", "3", "--num_actions", "8",
              "--embedding_dim", "16", "--stages", "corpus", "prepare"])
    # killed at the second batch's record (540 of 600 articles), so the first batch's record is on disk
    results = resume.main(["--out_dir", str(out), "--articles", "600", "--tokens_at", "0.9"])
    first, second, third = results["attempts"]
    assert (first["exit"], second["exit"], third["exit"]) == (-9, -9, 0)
    assert first["found"] == {"embedding_chunks": None, "token_articles": None}
    assert first["first_written"] == {"embedding": 1} and first["targets"]["embedding"] == 2
    # the rerun finds the chunk recorded before the kill and writes the one the kill cut, not the first
    assert second["found"]["embedding_chunks"] == 1 and second["first_written"]["embedding"] == 2
    assert second["found"]["token_articles"] is None and second["first_written"]["tokens"] == 512
    assert second["targets"]["tokens"] == 540 and second["last_written"]["tokens"] == 512
    # the third finds the whole embedding and the first batch's tokens: it embeds nothing and tokenises the rest
    assert third["found"] == {"embedding_chunks": 3, "token_articles": 512}
    assert "embedding" not in third["first_written"] and third["first_written"]["tokens"] == 600
    assert "fit_codebook" not in [p["phase"] for p in third["phases"]]  # the interrupted build's fit, reused
    assert results["differing_files"] == [] and results["files_compared"] > 20
    assert "all bit-identical" in (out / "n600" / "resume" / "report.md").read_text()
