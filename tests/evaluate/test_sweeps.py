import json

import pytest

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import compare
from planlm.evaluate.sweeps import sweep

from helpers import read_csv, tiny_planned_lm, tiny_planner, use_planner


@pytest.fixture(scope="module")
def planned(tmp_path_factory, synthetic_random):
    """A multipath planned LM whose config points at a (random) planner folder."""
    prepared = PreparedDataset(synthetic_random)
    root = tmp_path_factory.mktemp("sweep_models")
    tiny_planner(prepared).save_pretrained(root / "planner")
    model = tiny_planned_lm(prepared, adapter="multipath")
    use_planner(model, str(root / "planner"))
    model.save_pretrained(root / "model")
    return root / "model"


def test_num_paths_sweep_writes_one_evaluation_per_k_a_csv_and_a_plot(planned, synthetic_random, tmp_path):
    out = sweep(str(planned), str(synthetic_random), str(tmp_path / "k"), num_paths=[1, 4], max_articles=4,
                bootstrap_samples=50, runtime=Runtime(device="cpu"))
    rows = read_csv(out / "sweep_num_paths.csv")
    assert [int(r["K"]) for r in rows] == [1, 4] and float(rows[0]["relative_wall_time"]) == 1.0
    for row in rows:  # every point is a complete evaluation whose numbers the table repeats
        metrics = json.loads((tmp_path / "k" / f"num_paths-{row['value']}" / "metrics.json").read_text())
        assert float(row["ppl"]) == pytest.approx(metrics["ppl"]) and metrics["K"] == int(row["value"])
        assert float(row["relative_wall_time"]) == pytest.approx(metrics["wall_time_s"] / float(rows[0]["wall_time_s"]))
    assert rows[0]["ppl"] != rows[1]["ppl"]  # K reaches the model
    # Each point against K = 1 on the same articles: the difference of the two perplexities, with a paired
    # interval narrower than the points' own intervals over articles.
    paired = compare(str(tmp_path / "k" / "num_paths-1"), str(tmp_path / "k" / "num_paths-4"), num_samples=50)
    assert float(rows[1]["paired_diff"]) == pytest.approx(float(rows[1]["ppl"]) - float(rows[0]["ppl"]))
    assert float(rows[1]["paired_ci_low"]) == pytest.approx(paired["ci_low"]) and float(rows[0]["paired_diff"]) == 0
    assert float(rows[1]["paired_ci_high"]) - float(rows[1]["paired_ci_low"]) < \
        float(rows[1]["ci_high"]) - float(rows[1]["ci_low"])
    assert (out / "sweep_num_paths.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "manifest.json").is_file()


def test_temperature_sweep_through_the_cli(planned, synthetic_random, tmp_path, capsys):
    from planlm.cli import main

    main(["sweep", "--model_dir", str(planned), "--prepared_dir", str(synthetic_random), "--out_dir",
          str(tmp_path / "tau"), "--kind", "temperature", "--temperatures", "[0.5, 2.0]", "--plans.num_paths", "3",
          "--max_articles", "3", "--bootstrap_samples", "20", "--runtime.device", "cpu"])
    rows = read_csv(tmp_path / "tau" / "sweep_temperature.csv")
    assert [float(r["tau"]) for r in rows] == [0.5, 1.0, 2.0] and {r["K"] for r in rows} == {"3"}  # + the reference
    assert float(rows[1]["paired_diff"]) == 0.0 and {float(r["reference"]) for r in rows} == {1.0}
    assert "time (rel.)" in capsys.readouterr().out
    assert (tmp_path / "tau" / "sweep_temperature.png").is_file()
    with pytest.raises(PlanlmError, match="every K must be >= 1"):
        sweep(str(planned), str(synthetic_random), str(tmp_path / "bad"), num_paths=[0, 2])
