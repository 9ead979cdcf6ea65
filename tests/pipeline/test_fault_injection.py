"""Fault injection: every artifact kind of a finished tiny run folder is damaged in turn (cut short, a block of
zeros, a wrong shape, removed, invalid JSON), and every command that reads it must either rebuild it with the
clean run's numbers or stop with one line and a non-zero exit status; never a traceback, a silently different
number or exit status 0 with a failed stage. A full disk during a stage's write leaves no manifest and a clear
error, and the next run rebuilds.

One tiny run (prepare, planner, one planner-sampled condition, evaluate: about a minute on 2 cores) is built per
module; each case restores it to the same path (the reuse keys hold paths) and damages one file."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from planlm.cli import main

from helpers import tiny_run_config

CACHE = "planner/plans/K2-T2-tau1-seed0"
ARTIFACTS = {  # kind -> the file of the tiny run that holds it
    "prepared array": "prepared/test/input_ids.npy",
    "prepared articles": "prepared/test/articles.jsonl",
    "codebook": "prepared/codebook.safetensors",
    "prepared manifest": "prepared/manifest.json",
    "planner weights": "planner/model.safetensors",
    "planner config": "planner/config.json",
    "plan cache": f"{CACHE}/validation.npy",
    "plan cache manifest": f"{CACHE}/manifest.json",
    "LM weights": "lm/ours/lm/model.safetensors",
    "adapter": "lm/ours/adapter.safetensors",
    "LM config": "lm/ours/planned_lm.json",
    "tokenizer": "lm/ours/tokenizer/tokenizer.json",
    "LM manifest": "lm/ours/manifest.json",
    "checkpoint": "lm/ours/checkpoints/last.ckpt",
    "evaluation": "eval/ours/per_article.csv",
    "evaluation metrics": "eval/ours/metrics.json",
}
EVALUATE = ["--stride", "32", "--context_length", "64", "--batch_size", "32", "--bootstrap_samples", "50"]
EVALUATIONS = ("evaluation", "evaluation metrics")  # read by `planlm compare` (and `planlm run`, below)


# ------------------------------------------------------------------------------------------ the faults
def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def zero(path: Path) -> None:
    """64 zero bytes in the middle of the file: its size, and often its header, unchanged."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(len(data[middle:middle + 64]))
    path.write_bytes(bytes(data))


def wrong_shape(path: Path) -> None:
    """The same values in another shape (an array or a tensor), or valid JSON of another structure."""
    if path.suffix == ".npy":
        array = np.load(path)
        np.save(path, array.reshape(array.shape[::-1]) if array.ndim > 1 else array.reshape(2, -1)
                if len(array) % 2 == 0 else array[:-1])
    elif path.suffix == ".safetensors":
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(path))
        name = max(tensors, key=lambda n: tensors[n].numel())
        tensors[name] = tensors[name].reshape(-1)
        save_file(tensors, str(path))
    else:
        path.write_text("[]")


def remove(path: Path) -> None:
    path.unlink()


def invalid_json(path: Path) -> None:
    path.write_text('{"written": "by hand", oops')


FAULTS = {"truncate": truncate, "zero": zero, "wrong_shape": wrong_shape, "remove": remove,
          "invalid_json": invalid_json}


def faults_of(rel: str) -> list[str]:
    faults = ["truncate", "zero", "remove"]
    faults += ["wrong_shape"] if rel.endswith((".npy", ".safetensors", ".json")) else []
    return faults + (["invalid_json"] if rel.endswith((".json", ".jsonl")) else [])


CASES = [pytest.param(kind, fault, id=f"{kind.replace(' ', '_')}-{fault}")
         for kind, rel in ARTIFACTS.items() for fault in faults_of(rel)]


# ------------------------------------------------------------------------------------------ the run
@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """(run folder, pristine copy, config file, the clean numbers)."""
    root = tmp_path_factory.mktemp("faults")
    config = tiny_run_config(root / "run", edit_distance=None, sweeps=[], conditions=[
        {"name": "ours", "plans": {"kind": "planner_sampled", "num_paths": 2, "horizon": 2}}])
    config["prepare"]["corpus"].update(num_train=12, num_validation=3, num_test=3)
    config["planner"]["train"]["max_epochs"] = 1
    config["lm"]["train"]["max_steps"] = 2
    config["evaluate"]["bootstrap_samples"] = 50
    config_file = root / "run.yaml"
    config_file.write_text(yaml.safe_dump(config))
    status, err = planlm(["run", "--config", str(config_file)])
    assert status == 0, err
    run = root / "run"
    numbers = {"test": metrics(run / "eval" / "ours")["ppl"],
               "cache": evaluate(run, root / "clean-cache-eval", cache=True)}
    shutil.copytree(run, root / "pristine", symlinks=True)
    return run, root / "pristine", config_file, numbers


@pytest.fixture
def run_dir(clean):
    """The clean run at its own path (the reuse keys hold paths), restored whole after the test."""
    run, pristine, _, _ = clean
    yield run
    shutil.rmtree(run)
    shutil.copytree(pristine, run, symlinks=True)


@pytest.fixture
def damaged(clean, request):
    """The clean run with the file of ``kind`` damaged by ``fault`` (the parameters), restored after the test."""
    run, pristine, _, _ = clean
    kind, fault = request.node.callspec.params["kind"], request.node.callspec.params["fault"]
    FAULTS[fault](run / ARTIFACTS[kind])
    yield run, ARTIFACTS[kind]
    shutil.copy2(pristine / ARTIFACTS[kind], run / ARTIFACTS[kind])


def planlm(argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of the real CLI, in this process."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main(argv)
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
    return status, err.getvalue()


def metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def evaluate(run: Path, out: Path, cache: bool = False) -> float:
    status, err = planlm(evaluate_argv(run, out, cache))
    assert status == 0, err
    return metrics(out)["ppl"]


def evaluate_argv(run: Path, out: Path, cache: bool = False) -> list[str]:
    argv = ["evaluate", "--model_dir", str(run / "lm" / "ours"), "--prepared_dir", str(run / "prepared"),
            "--out_dir", str(out), *EVALUATE]
    return argv + (["--split", "validation", "--plans.plans_dir", str(run / CACHE)] if cache else [])


def assert_one_line_error(status: int, err: str, rel: str) -> None:
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("planlm: error:")]
    assert status != 0 and len(errors) == 1, err
    assert Path(rel).name in errors[0] or str(Path(rel).parent) in errors[0], errors[0]


# ------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("kind, fault", [c for c in CASES if c.values[0] in EVALUATIONS])
def test_compare_refuses_a_damaged_evaluation_in_one_line(damaged, kind, fault):
    run_dir, rel = damaged
    status, err = planlm(["compare", "--a", str(run_dir / "eval" / "ours"), "--b", str(run_dir / "eval" / "ours")])
    assert_one_line_error(status, err, rel)


# The checkpoint is read by train-lm only when it resumes (below); the evaluations by compare (above).
@pytest.mark.parametrize("kind, fault", [c for c in CASES if c.values[0] not in ("checkpoint", *EVALUATIONS)])
def test_a_reader_refuses_a_damaged_file_in_one_line_or_gives_the_clean_numbers(clean, damaged, tmp_path, kind,
                                                                               fault):
    run_dir, rel = damaged
    cache = kind.startswith("plan cache")
    status, err = planlm(evaluate_argv(run_dir, tmp_path / "eval", cache))
    if status == 0:  # a file this command does not read: the clean number
        assert "Traceback" not in err
        assert metrics(tmp_path / "eval")["ppl"] == clean[3]["cache" if cache else "test"]
    else:
        assert_one_line_error(status, err, rel)
        assert not (tmp_path / "eval" / "manifest.json").exists()


@pytest.mark.parametrize("kind, fault", [c for c in CASES if ARTIFACTS[c.values[0]].split("/")[-2] != "checkpoints"])
def test_verify_names_every_damaged_file(damaged, kind, fault, capsys):
    run_dir, rel = damaged
    status, err = planlm(["verify", "--run_dir", str(run_dir)])
    out = capsys.readouterr().out
    assert status == 1 and "Traceback" not in err, err
    stage = next(line for line in out.splitlines() if "damaged" in line or "incomplete" in line)
    assert Path(rel).name in stage or "manifest.json" in stage, out
    assert planlm(["verify", "--run_dir", str(run_dir), "--quick", "true"])[0] == 1  # the cheap check sees it too


# Every other command that reads a stage folder, each on one damaged input (its loaders are those above).
def command_argv(command: str, run: Path, out: Path) -> list[str]:
    model, prepared = ["--model_dir", str(run / "lm" / "ours")], ["--prepared_dir", str(run / "prepared")]
    return {"generate": ["generate", *model, *prepared, "--article", "0", "--sampling.max_new_tokens", "4"],
            "edit-distance": ["edit-distance", *model, *prepared, "--out_dir", str(out), "--max_articles", "1"],
            "sweep": ["sweep", *model, *prepared, "--out_dir", str(out), "--num_paths", "[1, 2]"],
            "actions": ["actions", *prepared, "--out_dir", str(out)],
            "train-planner": ["train-planner", *prepared, "--out_dir", str(out)],
            "train-lm": ["train-lm", *prepared, "--out_dir", str(out), "--plans.kind", "planner_sampled",
                         "--plans.num_paths", "2", "--plans.horizon", "2", "--plans.plans_dir", str(run / CACHE)],
            "sample-plans": ["sample-plans", "--plans.planner_dir", str(run / "planner"), *prepared, "--out_dir",
                             str(out)],
            }[command]


COMMAND_CASES = [("generate", "LM weights", "truncate"), ("edit-distance", "adapter", "zero"),
                 ("sweep", "planner weights", "wrong_shape"), ("actions", "codebook", "remove"),
                 ("train-planner", "prepared array", "zero"), ("train-lm", "plan cache", "truncate"),
                 ("sample-plans", "planner config", "invalid_json")]


@pytest.mark.parametrize("command, kind, fault", COMMAND_CASES, ids=[c[0] for c in COMMAND_CASES])
def test_every_command_refuses_a_damaged_input_in_one_line(damaged, tmp_path, command, kind, fault):
    run_dir, rel = damaged
    status, err = planlm(command_argv(command, run_dir, tmp_path / "out"))
    assert_one_line_error(status, err, rel)
    assert not (tmp_path / "out" / "manifest.json").exists()


# One fault per kind for `planlm run` (each reruns the pipeline, 3-10 s): the default suite has every stage and
# every fault; the other kinds are marked slow.
RUN_CASES = [("prepared array", "wrong_shape"), ("prepared manifest", "invalid_json"), ("planner weights", "zero"),
             ("LM weights", "truncate"), ("evaluation metrics", "remove")]
SLOW_RUN_CASES = [("prepared articles", "zero"), ("codebook", "truncate"), ("planner config", "remove"),
                  ("adapter", "wrong_shape"), ("LM config", "invalid_json"), ("tokenizer", "remove"),
                  ("LM manifest", "truncate"), ("evaluation", "zero")]


@pytest.mark.parametrize("kind, fault", [
    *(pytest.param(k, f, id=f"{k.replace(' ', '_')}-{f}") for k, f in RUN_CASES),
    *(pytest.param(k, f, id=f"{k.replace(' ', '_')}-{f}", marks=pytest.mark.slow) for k, f in SLOW_RUN_CASES)])
def test_run_rebuilds_a_damaged_stage_with_the_clean_numbers(clean, run_dir, kind, fault):
    rel = ARTIFACTS[kind]
    FAULTS[fault](run_dir / rel)
    status, err = planlm(["run", "--config", str(clean[2])])
    assert status == 0 and "Traceback" not in err, err
    notes = [line for line in err.splitlines() if line.startswith("planlm: ") and "rebuilding" in line]
    assert len(notes) == 1 and Path(rel).name in notes[0], err
    assert metrics(run_dir / "eval" / "ours")["ppl"] == clean[3]["test"]
    assert planlm(["verify", "--run_dir", str(run_dir)])[0] == 0
    state = json.loads((run_dir / "run_state.json").read_text())["stages"]
    stage = {"prepared": "prepare", "planner": "train-planner", "lm": "train-lm ours", "eval": "evaluate ours"}
    assert state[stage[rel.split("/")[0]]]["ran_now"]
    if not rel.startswith("prepared"):
        assert not state["prepare"]["ran_now"]  # the stages before the damaged one are reused


def test_sample_plans_rebuilds_a_damaged_cache_with_the_same_plans(run_dir, clean):
    before = np.load(clean[1] / CACHE / "validation.npy")
    truncate(run_dir / CACHE / "validation.npy")
    argv = ["sample-plans", "--plans.planner_dir", str(run_dir / "planner"), "--prepared_dir",
            str(run_dir / "prepared"), "--splits", "[train, validation]", "--plans.num_paths", "2", "--plans.horizon",
            "2", "--plans.seed", "0"]
    status, err = planlm(argv)
    assert status == 0 and "validation.npy" in err and "rebuilding" in err, err
    np.testing.assert_array_equal(np.load(run_dir / CACHE / "validation.npy"), before)


def test_run_retrains_from_the_start_past_a_damaged_checkpoint(clean, run_dir):
    truncate(run_dir / ARTIFACTS["checkpoint"])
    (run_dir / ARTIFACTS["LM manifest"]).unlink()  # an interrupted train-lm: it resumes from its checkpoint
    status, err = planlm(["run", "--config", str(clean[2])])
    assert status == 0 and "damaged checkpoint" in err and "Traceback" not in err, err
    assert metrics(run_dir / "eval" / "ours")["ppl"] == clean[3]["test"]


def test_a_full_disk_while_saving_the_lm_leaves_no_manifest_and_the_next_run_rebuilds(clean, run_dir, monkeypatch):
    import planlm.models.planned_lm as planned_lm

    real_save = planned_lm.save_safetensors

    def disk_full(tensors, filename):  # half the file reaches the disk, then ENOSPC
        real_save(tensors, filename)
        truncate(Path(filename))
        raise OSError(errno.ENOSPC, "No space left on device", str(filename))

    shutil.rmtree(run_dir / "lm" / "ours")
    monkeypatch.setattr(planned_lm, "save_safetensors", disk_full)
    status, err = planlm(["run", "--config", str(clean[2])])
    assert status == 1 and "Traceback" not in err, err
    assert not (run_dir / "lm" / "ours" / "manifest.json").exists()
    cause = next(line for line in err.splitlines() if line.startswith("train-lm ours: failed:"))
    assert "No space left on device" in cause and "adapter.safetensors" in cause
    assert any(line.startswith("evaluate ours: skipped") for line in err.splitlines())
    assert err.strip().splitlines()[-1].startswith("planlm: error: 2 of 4 stages did not finish")

    monkeypatch.setattr(planned_lm, "save_safetensors", real_save)
    status, err = planlm(["run", "--config", str(clean[2])])
    assert status == 0, err
    assert metrics(run_dir / "eval" / "ours")["ppl"] == clean[3]["test"]


def test_a_full_disk_in_a_command_is_one_line_and_leaves_no_manifest(run_dir, tmp_path, monkeypatch):
    import planlm.evaluate.perplexity as perplexity

    def disk_full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(perplexity, "write_per_article", disk_full)
    status, err = planlm(evaluate_argv(run_dir, tmp_path / "eval"))
    assert_one_line_error(status, err, str(tmp_path / "eval" / "per_article.csv"))
    assert "No space left on device" in err and not (tmp_path / "eval" / "manifest.json").exists()


def test_a_zeroed_block_beyond_the_hash_budget_is_missed_by_the_cheap_check_and_found_by_verify(run_dir, monkeypatch,
                                                                                                 capsys):
    """The cheap check hashes a stage's smallest files up to QUICK_HASH_BYTES (128 MiB); a large file beyond it keeps
    its size and header when a block of it is zeroed, so only `planlm verify`'s full hash finds that. The budget is
    lowered here to just below the LM stage's total, so its largest file (the LM's weights) is the one beyond it."""
    from planlm.stage import integrity

    stage = run_dir / "lm" / "ours"
    files = json.loads((stage / "manifest.json").read_text())["files"]
    rel = max(files, key=lambda name: files[name]["size"])
    assert rel == "lm/model.safetensors"
    zero(stage / rel)
    assert planlm(["verify", "--run_dir", str(run_dir), "--quick", "true"])[0] == 1  # within the real budget: hashed
    monkeypatch.setattr(integrity, "QUICK_HASH_BYTES", sum(f["size"] for f in files.values()) - 1)
    capsys.readouterr()
    assert planlm(["verify", "--run_dir", str(run_dir), "--quick", "true"])[0] == 0  # beyond it: missed
    assert "5 stage folders intact" in capsys.readouterr().out
    status, err = planlm(["verify", "--run_dir", str(run_dir)])
    out = capsys.readouterr().out
    assert status == 1 and "Traceback" not in err, err
    stage_line = next(line for line in out.splitlines() if "damaged" in line)
    assert "model.safetensors" in stage_line, out


def test_verify_finds_the_restored_run_intact(clean, capsys):
    """Last: every case above left the run as it was, and verify says so with status 0."""
    status, err = planlm(["verify", "--run_dir", str(clean[0])])
    assert status == 0, capsys.readouterr().out + err
    assert "5 stage folders intact" in capsys.readouterr().out  # prepared, planner, plan cache, LM, evaluation
