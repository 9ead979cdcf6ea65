"""`planlm across-runs`: runs side by side against their LM training compute, and the slope across them.

The fast tests build run folders with the writers the pipeline uses (a prepared corpus, train-lm manifests and the
LM's config.json, per-article evaluations, the run report's results.json) and NLLs whose contrasts are known, so the
compute, each run's numbers and the fitted slope have known answers. The slow test chains two tiny `planlm run`s."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from planlm.cli import main
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import write_per_article
from planlm.pipeline.across_runs import across_runs, fit_slope, read_run
from planlm.pipeline.layout import BASE_LM, RunLayout
from planlm.pipeline.report import write_report
from planlm.stage.manifest import write_manifest
from planlm.testing.synthetic import make_synthetic_prepared

from helpers import read_csv

CONTEXT, STRIDE, BATCH = 16, 15, 4
SEEDS = (0, 1, 2)
PIECES = (1, 5, 2, 4, 3, 2, 6, 1)  # test documents cut into unequal numbers of pieces, as prepare cuts speeches
DOCUMENTS = len(PIECES)
DOCUMENT_OF = np.repeat(np.arange(DOCUMENTS), PIECES)  # (articles,) each piece's document
PIECE_OF = np.concatenate([np.arange(n) for n in PIECES])  # (articles,) its place in its document
ORACLE = -3.0  # the oracle's gain over Fixed, % of perplexity, in every run and seed


def gpt2_config(layers: int, width: int) -> dict:
    return {"model_type": "gpt2", "n_layer": layers, "n_embd": width, "n_head": 2, "n_positions": 64,
            "vocab_size": 50257}


def gpt2_non_embedding(layers: int, width: int) -> int:
    """A GPT-2 block's weights and biases (attention 4 d^2 + 4 d, MLP 8 d^2 + 5 d, two layer norms 4 d), and the
    final layer norm: what 6 N D counts."""
    return layers * (12 * width ** 2 + 13 * width) + 2 * width


def tokens_per_epoch(prepared) -> tuple[int, int]:
    """(tokens processed in one epoch, windows) of the training split, counted by hand: an article of n tokens gives
    1 + ceil((n - CONTEXT) / STRIDE) windows that overlap by CONTEXT - STRIDE tokens."""
    offsets = np.asarray(PreparedDataset(str(prepared)).split("train").token_offsets)
    tokens = windows = 0
    for n in np.diff(offsets):
        if n < 2:
            continue
        count = 1 + max(0, math.ceil((n - CONTEXT) / STRIDE))
        tokens += n + (count - 1) * (CONTEXT - STRIDE)
        windows += count
    return tokens, windows


def write_lm(folder, layers: int, width: int, global_step: int, init_from=None) -> None:
    """A finished train-lm folder as far as compute reads it: the LM's config.json and the manifest's record."""
    from transformers import AutoConfig

    config = gpt2_config(layers, width)
    AutoConfig.for_model(**config).save_pretrained(str(folder / "lm"))
    write_manifest(folder, {"model": {"name_or_path": None, "model_config": config, "init_from": init_from},
                            "train": {"batch_size": BATCH, "accumulate_grad_batches": 1, "max_epochs": 1,
                                      "max_steps": -1, "limit_train_batches": None, "devices": "auto",
                                      "num_nodes": 1, "context_length": CONTEXT, "stride": STRIDE}},
                   global_step=global_step)


def write_evaluation(folder, nll: np.ndarray, tokens: np.ndarray, sources: list, conditioning: str) -> None:
    folder.mkdir(parents=True)
    write_per_article(folder / "per_article.csv", [
        {"article": i, "id": f"{sources[i]}#{PIECE_OF[i]}", "source": sources[i], "nll_sum": repr(float(n)),
         "tokens": int(t)} for i, (n, t) in enumerate(zip(nll, tokens))])
    (folder / "metrics.json").write_text(json.dumps({
        "ppl": float(np.exp(nll.sum() / tokens.sum())), "ci_low": 1.0, "ci_high": 2.0, "conditioning": conditioning,
        "K": 1, "T": 1, "tau": 1.0, "tokens": int(tokens.sum()), "articles": len(nll), "protocol": "test"}))


KINDS = {"none": "none", "fixed": "fixed", "ours": "planner_sampled", "oracle": "oracle"}


def make_run(root, prepared_source, name: str, layers: int, width: int, epochs: int, base_epochs: int,
             ours: float, seed_spread: tuple = (0.0, 0.0, 0.0), document_noise: float = 0.0,
             contrasts=(("ours", "fixed"), ("oracle", "fixed"))) -> RunLayout:
    """A run of ``epochs`` per condition after a base LM of ``base_epochs``, whose ours - Fixed is ``ours`` % of
    Fixed's perplexity plus ``seed_spread[s]`` at seed s, and whose oracle - Fixed is ORACLE %. Every per-article NLL
    of a condition is Fixed's shifted by the same amount per token (a perplexity ratio exp(shift)), so each seed's
    contrast is exact; ``document_noise`` adds per-article noise to ours."""
    import shutil

    layout = RunLayout(root / name)
    shutil.copytree(prepared_source, layout.prepared)
    per_epoch, windows = tokens_per_epoch(layout.prepared)
    steps = math.ceil(windows / BATCH)
    rng = np.random.default_rng(len(name))
    tokens = np.full(len(DOCUMENT_OF), 90.0) + np.arange(len(DOCUMENT_OF))
    sources = [f"speech{d}" for d in DOCUMENT_OF]
    level = 5.0 + rng.normal(0, 0.2, DOCUMENTS)[DOCUMENT_OF]
    for seed, spread in zip(SEEDS, seed_spread):
        base = layout.lm(BASE_LM, seed)
        write_lm(base, layers, width, base_epochs * steps)
        fixed = level * tokens
        shifts = {"none": 0.0, "fixed": 0.0, "ours": math.log1p((ours + spread) / 100), "oracle": math.log1p(ORACLE / 100)}
        for condition, shift in shifts.items():
            write_lm(layout.lm(condition, seed), layers, width, epochs * steps, init_from=str(base))
            nll = fixed + shift * tokens
            if condition == "ours" and document_noise:
                nll = nll + rng.normal(0, document_noise, len(tokens)) * tokens
            write_evaluation(layout.evaluation(condition, seed), nll, tokens, sources, KINDS[condition])
    write_report(layout.root, conditions=[{"name": c} for c in KINDS], seeds=list(SEEDS), actions_shown=0,
                 contrasts=[list(pair) for pair in contrasts])
    layout.root.joinpath("expected.json").write_text(json.dumps({
        "flops": 6.0 * gpt2_non_embedding(layers, width) * (epochs + base_epochs) * per_epoch}))
    return layout


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return make_synthetic_prepared(tmp_path_factory.mktemp("corpus") / "prepared",
                                   num_articles={"train": 30, "validation": 4, "test": 4})


SLOPE = -0.4  # ours - Fixed, % of perplexity, per tenfold compute
SPREAD = (-0.1, 0.05, 0.05)  # each seed's ours - Fixed about the run's mean: the mean is exact


def ladder(tmp_path, prepared, slope: float = SLOPE, document_noise: float = 0.0) -> list[RunLayout]:
    """Three runs at known computes (more than tenfold apart) whose ours - Fixed lies on a line in log10 compute,
    -0.5 % at the first."""
    shapes = [("small", 1, 32, 1, 1), ("wide", 2, 64, 1, 1), ("long", 2, 64, 7, 1)]
    flops = [gpt2_non_embedding(layers, width) * (epochs + base) for _, layers, width, epochs, base in shapes]
    return [make_run(tmp_path, prepared, name, layers, width, epochs, base,
                     -0.5 + slope * math.log10(c / flops[0]), SPREAD, document_noise)
            for (name, layers, width, epochs, base), c in zip(shapes, flops)]


@pytest.fixture(scope="module")
def known_ladder(tmp_path_factory, prepared) -> list[RunLayout]:
    return ladder(tmp_path_factory.mktemp("ladder"), prepared)


def test_compute_is_six_n_d_from_the_manifests(tmp_path, prepared):
    layout = make_run(tmp_path, prepared, "r", 2, 64, epochs=3, base_epochs=1, ours=-1.0)
    run = read_run(layout.root, ["fixed", "ours", "oracle"])
    per_epoch, _ = tokens_per_epoch(layout.prepared)
    assert run.compute.non_embedding_parameters == gpt2_non_embedding(2, 64)
    assert (run.compute.base_tokens, run.compute.condition_tokens) == (per_epoch, 3 * per_epoch)
    assert run.compute.flops == pytest.approx(6 * gpt2_non_embedding(2, 64) * 4 * per_epoch)
    assert run.compute.model == "gpt2 2 x 64" and not run.compute.pretrained
    assert run.seeds == list(SEEDS)


def test_the_slope_has_its_known_answer_and_every_seed_is_shown(tmp_path, known_ladder):
    runs = known_ladder
    out = tmp_path / "across"
    across_runs([str(r.root) for r in runs], str(out))
    result = json.loads((out / "across_runs.json").read_text())
    flops = [json.loads((r.root / "expected.json").read_text())["flops"] for r in runs]
    assert [row["compute"]["flops"] for row in result["runs"]] == pytest.approx(flops)
    assert math.log10(flops[-1] / flops[0]) > 1  # the runs span more than a tenfold compute
    fits = {fit["label"]: fit for fit in result["fits"]}
    ours = fits["ours - fixed"]
    assert ours["slope"] == pytest.approx(SLOPE, abs=1e-6)  # the line the NLLs were written on
    assert ours["residuals"] == pytest.approx([0, 0, 0], abs=1e-6)
    # no document noise here (each seed's ours is Fixed shifted per token): the interval is the seeds' alone,
    # sqrt(sum_r w_r^2 var_r) with var_r the variance of run r's seed mean, at the t quantile of its Satterthwaite df
    x = np.log10(flops)
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()
    per_run_var = np.var(100 * np.expm1(np.log1p(np.array(SPREAD) / 100)), ddof=1) / len(SEEDS)
    assert ours["document_se"] == pytest.approx(0, abs=1e-9)
    assert ours["seed_se"] == pytest.approx(math.sqrt((w ** 2).sum() * per_run_var), rel=1e-6)
    assert ours["seed_dof"] == pytest.approx(2 * (w ** 2).sum() ** 2 / (w ** 4).sum(), rel=1e-6)
    assert ours["ci_low"] < SLOPE < ours["ci_high"] < 0  # decided: the gain grows with compute
    assert fits["oracle - fixed"]["slope"] == pytest.approx(0, abs=1e-6)  # the oracle's gain is flat
    assert fits["share ours"]["slope"] == pytest.approx(SLOPE / ORACLE, abs=1e-6)
    # each run's contrast, in % and in perplexity, with each seed's value
    first = result["runs"][0]["contrasts"][0]
    assert first["relative"] == pytest.approx(-0.5, abs=1e-6)
    assert first["seed_relatives"] == pytest.approx([-0.5 + s for s in SPREAD], abs=1e-6)
    assert first["diff"] == pytest.approx(np.mean(first["seed_diffs"]))
    share = result["runs"][0]["shares"][0]
    assert share["share"] == pytest.approx(-0.5 / ORACLE, rel=1e-4)
    assert share["seed_shares"] == pytest.approx([(-0.5 + s) / ORACLE for s in SPREAD], rel=1e-4)
    table = (out / "across_runs.md").read_text()
    assert all(f"| {r.root.name} | gpt2 " in table for r in runs)
    assert "(seeds: -0.60, -0.45, -0.45)" in table and "| ours - fixed | -0.400 [" in table
    rows = read_csv(out / "across_runs.csv")
    assert {(r["run"], r["kind"]) for r in rows} >= {("small", "percent"), ("long", "share"),
                                                     ("slope per log10 compute", "relative slope")}
    assert (out / "across_runs.png").stat().st_size > 10_000


def test_the_line_carried_to_a_larger_compute_has_its_known_value_and_interval(tmp_path, known_ladder):
    runs = known_ladder
    flops = [json.loads((r.root / "expected.json").read_text())["flops"] for r in runs]
    far = flops[-1] * 10 ** 2.5
    out = tmp_path / "across"
    across_runs([str(r.root) for r in runs], str(out), predict_at=[far])
    fit = next(f for f in json.loads((out / "across_runs.json").read_text())["fits"] if f["label"] == "ours - fixed")
    (predicted,) = fit["predictions"]
    assert predicted["value"] == pytest.approx(-0.5 + SLOPE * math.log10(far / flops[0]), abs=1e-6)
    assert predicted["decades_past_runs"] == pytest.approx(2.5)
    # the line's value is sum_r v_r y_r with v_r = 1/n + (x0 - mean x) w_r: its seed SE and df by hand
    x = np.log10(flops)
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()
    v = 1 / len(x) + (math.log10(far) - x.mean()) * w
    per_run_var = np.var(100 * np.expm1(np.log1p(np.array(SPREAD) / 100)), ddof=1) / len(SEEDS)
    assert predicted["seed_se"] == pytest.approx(math.sqrt((v ** 2).sum() * per_run_var), rel=1e-6)
    assert predicted["seed_dof"] == pytest.approx(2 * (v ** 2).sum() ** 2 / (v ** 4).sum(), rel=1e-6)
    assert predicted["ci_high"] - predicted["value"] > fit["ci_high"] - fit["slope"]  # wider than the slope's
    table = (out / "across_runs.md").read_text()
    assert "## The fitted line at other computes" in table and "**extrapolation**" in table
    assert f"| ours - fixed | {far:.3g} | +2.50 | {predicted['value']:+.2f}% [" in table
    assert any(r["kind"] == "relative predicted" for r in read_csv(out / "across_runs.csv"))
    with pytest.raises(PlanlmError, match="--predict_at: -1.0 is not a compute"):
        across_runs([str(r.root) for r in runs], str(tmp_path / "bad"), predict_at=[-1.0])
    assert not (tmp_path / "bad").exists()


def test_document_noise_widens_the_interval_and_a_flat_line_is_not_decided(tmp_path, prepared):
    runs = ladder(tmp_path, prepared, slope=0.0, document_noise=0.01)
    fit = fit_slope([read_run(r.root, ["fixed", "ours", "oracle"]) for r in runs], ("relative", "ours", "fixed"))
    assert fit["document_se"] > 0.05 and fit["documents"] == DOCUMENTS
    assert fit["ci_low"] < 0 < fit["ci_high"]


def test_the_command_line_and_its_errors(tmp_path, prepared, known_ladder, capsys):
    runs = known_ladder
    out = tmp_path / "cli"
    main(["across-runs", "--run_dirs", json.dumps([str(r.root) for r in runs]), "--out_dir", str(out)])
    assert (out / "across_runs.md").is_file() and "3 runs, 3 fitted" in capsys.readouterr().out
    with pytest.raises(PlanlmError, match="no contrast in common"):
        odd = make_run(tmp_path, prepared, "odd", 1, 32, 1, 1, -1.0, contrasts=(("ours", "none"),))
        across_runs([str(runs[0].root), str(odd.root)], str(tmp_path / "x"))
    with pytest.raises(PlanlmError, match="a slope needs runs at two or more training computes"):
        fit_slope([read_run(runs[0].root, ["fixed", "ours"])], ("relative", "ours", "fixed"))
    with pytest.raises(PlanlmError, match="no such run folder"):
        across_runs([str(tmp_path / "nowhere")], str(tmp_path / "y"))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_tiny_runs_of_the_real_pipeline(tmp_path):
    """Two `planlm run`s (one seed each, no seed folders) that differ only in the LM's steps: the second's condition
    tokens are twice the first's, and the slope has a value and an interval over documents."""
    from planlm.pipeline.run import run

    from helpers import tiny_run_config

    runs = []
    for name, steps in (("short", 4), ("long", 8)):
        config = tiny_run_config(tmp_path / name)
        config["conditions"] = [c for c in config["conditions"] if c["name"] in ("fixed", "ours", "oracle")]
        config["lm"]["train"]["max_steps"] = steps
        config.update(edit_distance=None, sweeps=[], base_lm={"train": {"max_steps": 2}},
                      report={"actions_shown": 0, "contrasts": [["ours", "fixed"], ["oracle", "fixed"]]})
        run(**config)
        runs.append(tmp_path / name)
    across_runs([str(r) for r in runs], str(tmp_path / "across"))
    result = json.loads((tmp_path / "across" / "across_runs.json").read_text())
    short, long = (row["compute"] for row in result["runs"])
    assert long["condition_tokens"] == pytest.approx(2 * short["condition_tokens"], abs=1)  # rounded to tokens
    assert long["base_tokens"] == short["base_tokens"] > 0
    assert long["non_embedding_parameters"] == short["non_embedding_parameters"] == gpt2_non_embedding(1, 32)
    assert {f["label"] for f in result["fits"] if "slope" in f} == {"ours - fixed", "oracle - fixed", "share ours"}
    assert all(f["seed_se"] == 0 and f["ci_low"] <= f["slope"] <= f["ci_high"] for f in result["fits"])
