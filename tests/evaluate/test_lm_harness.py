"""lm-evaluation-harness: the planlm model on local YAML tasks over local JSONL files (no hub), tiny models."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from helpers import sampled_multipath, tiny_gpt2, tiny_planned_lm, use_planner  # noqa: E402
from planlm.data.artifacts import PreparedDataset  # noqa: E402
from planlm.errors import PlanlmError  # noqa: E402
from planlm.evaluate.lm_harness import PlannedLMEval  # noqa: E402
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig  # noqa: E402
from planlm.plans.sources import OraclePlans  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folders(synthetic_random, tmp_path_factory):
    """A none model (and its bare LM for --model hf), an oracle model and a sampled multipath model with its planner."""
    root = tmp_path_factory.mktemp("lm_eval_models")
    prepared = PreparedDataset(synthetic_random)
    tokenizer = tiny_planned_lm(prepared).load_tokenizer()
    PlannedLM(PlannedLMConfig(), tiny_gpt2()).save_pretrained(root / "none", tokenizer=tokenizer)
    tiny_planned_lm(prepared).save_pretrained(root / "oracle", tokenizer=tokenizer)
    model, _ = sampled_multipath(prepared, root / "planner")
    use_planner(model, root / "planner").save_pretrained(root / "ours", tokenizer=tokenizer)
    return root


def rolling(texts):
    return [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(texts)]


def pairs(items):
    return [Instance("loglikelihood", {}, item, i) for i, item in enumerate(items)]


def test_registered_and_declared_as_the_lm_eval_plugin():
    assert get_model("planlm") is PlannedLMEval  # importing planlm.evaluate.lm_harness registers it
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["lm_eval.models"]
    module, name = entry["planlm"].split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is PlannedLMEval


def test_a_none_model_scores_like_the_hf_backend(folders, synthetic_random):
    from lm_eval.models.huggingface import HFLM

    texts = [a["text"] for a in PreparedDataset(synthetic_random).split("test").articles[:3]]
    options = {"batch_size": 2, "device": "cpu"}
    ours = PlannedLMEval.create_from_arg_obj({"model_dir": str(folders / "none"), "max_length": 24}, options)
    hf = HFLM(pretrained=str(folders / "none" / "lm"), tokenizer=str(folders / "none" / "tokenizer"),
              dtype="float32", max_length=24, **options)
    # 24-token windows: every article takes several
    np.testing.assert_allclose(ours.loglikelihood_rolling(rolling(texts)), hf.loglikelihood_rolling(rolling(texts)),
                               rtol=1e-4)
    items = pairs([(texts[0][:30], texts[0][30:70]), (texts[0][:30] + " ", "Red."), ("", texts[1][:40])])
    ours_ll, hf_ll = ours.loglikelihood(items), hf.loglikelihood(items)
    np.testing.assert_allclose([v for v, _ in ours_ll], [v for v, _ in hf_ll], rtol=1e-4)
    assert [g for _, g in ours_ll] == [g for _, g in hf_ll]
    generate = [Instance("generate_until", {}, (texts[2][:40], {"until": ["river"], "max_gen_toks": 6,
                                                                 "do_sample": False}), 0)]
    assert ours.generate_until(generate) == hf.generate_until(generate)


def test_rolling_plans_are_the_prepared_corpus_plans(folders, synthetic_random):
    """An oracle model on a test article's text scores as its prepared tokens, alignment and oracle plans say."""
    prepared = PreparedDataset(synthetic_random)
    split = prepared.split("test")
    model = PlannedLM.from_pretrained(folders / "oracle").eval()
    ours = PlannedLMEval(model_dir=str(folders / "oracle"), prepared_dir=str(synthetic_random))
    tokens, sentences = split.token_range(0), split.sentence_range(0)
    ids = torch.from_numpy(np.array(split.input_ids[tokens.start:tokens.stop]))  # (L,)
    rows = np.array(split.token_plan_sentence[tokens.start:tokens.stop]) - sentences.start
    paths, mask, _ = OraclePlans(split, 2, 3)(np.arange(sentences.start, sentences.stop))  # (S, K, T)
    inputs = torch.cat([torch.tensor([ours.eot_token_id]), ids[:-1]])[None]  # (1, L): the prefix, then the text
    plan_index = torch.from_numpy(np.concatenate([[0], rows[:-1]]))[None]  # the prefix predicts sentence 0
    with torch.no_grad():
        logits = model(inputs, action_paths=paths, path_mask=mask, plan_index=plan_index).logits
    expected = torch.log_softmax(logits[0], -1).gather(1, ids[:, None]).sum()
    assert len(ids) < ours.max_length  # one window
    np.testing.assert_allclose(ours.loglikelihood_rolling(rolling([split.articles[0]["text"]])), [float(expected)],
                               rtol=1e-4)
    none = PlannedLMEval.create_from_arg_string(f"model_dir={folders / 'oracle'},kind=none")  # "none": not None
    assert none.plans.kind == "none" and not none.has_plans
    assert none.loglikelihood_rolling(rolling([split.articles[0]["text"]]))[0] != pytest.approx(float(expected))


def test_loglikelihood_plans_come_from_the_context(folders, synthetic_random):
    """Choices of one context share its plans; the continuation keeps the plan of the sentence it starts."""
    texts = [a["text"] for a in PreparedDataset(synthetic_random).split("test").articles[:2]]
    contexts = [text[:text.index(".", text.index(".") + 1) + 1] for text in texts]  # two sentences each
    ours = PlannedLMEval(model_dir=str(folders / "ours"), prepared_dir=str(synthetic_random), num_paths=2)
    requests = pairs([(contexts[0], " Red fish. Gold king."), (contexts[0], " Blue tree."),
                      (contexts[1], " Red fish. Gold king.")])
    encoded = [((c, x), *ours._encode_pair(c, x)) for c, x in (r.args for r in requests)]
    rows, table = ours._context_plan_rows(encoded)
    assert table.shape[0] == 2 * 3  # two contexts, each: two sentences + the one its continuations write
    (_, c0, x0), (_, c1, x1) = encoded[0], encoded[1]
    assert rows[0][:len(c0)] == rows[1][:len(c1)]  # the same context: the same plans
    assert len(set(rows[0][len(c0) - 1:])) == 1  # from the context's last token: one plan, the third sentence's
    assert len(set(rows[0][:len(c0)])) == 3  # sentences 0, 1 and (its last token) 2
    assert rows[2][0] != rows[0][0]  # another context, other plans
    scores = ours.loglikelihood(requests)
    plain = PlannedLMEval(model_dir=str(folders / "ours"), kind="none").loglikelihood(requests)
    assert all(np.isfinite(v) for v, _ in scores) and [v for v, _ in scores] != [v for v, _ in plain]


def write_local_tasks(folder: Path, prepared_dir) -> Path:
    """A perplexity task and a two-choice task over JSONL files written from the prepared test split."""
    articles = PreparedDataset(prepared_dir).split("test").articles[:4]
    with open(folder / "docs.jsonl", "w") as f:
        for article in articles:
            f.write(json.dumps({"text": article["text"]}) + "\n")
    with open(folder / "choices.jsonl", "w") as f:
        for i, article in enumerate(articles):
            sentences = article["text"].split(". ")
            other = articles[(i + 1) % len(articles)]["text"].split(". ")
            f.write(json.dumps({"context": ". ".join(sentences[:2]) + ".", "choices": [sentences[2], other[2]],
                                "label": 0}) + "\n")
    common = "dataset_path: json\ntest_split: test\n"
    (folder / "ppl.yaml").write_text(
        f"task: planlm_local_ppl\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'docs.jsonl'}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    (folder / "choice.yaml").write_text(
        f"task: planlm_local_choice\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'choices.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n")
    return folder


def test_local_yaml_tasks_through_simple_evaluate(folders, synthetic_random, tmp_path):
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(write_local_tasks(tmp_path, synthetic_random)))

    def run(model: str, model_args: str) -> dict:
        results = lm_eval.simple_evaluate(model=model, model_args=model_args, batch_size=4, device="cpu",
                                          tasks=["planlm_local_ppl", "planlm_local_choice"], task_manager=tasks)
        return results["results"]

    ours = run("planlm", f"model_dir={folders / 'none'}")
    hf = run("hf", f"pretrained={folders / 'none' / 'lm'},tokenizer={folders / 'none' / 'tokenizer'},dtype=float32")
    for task, metric in (("planlm_local_ppl", "word_perplexity,none"), ("planlm_local_ppl", "bits_per_byte,none"),
                         ("planlm_local_choice", "acc,none")):
        assert ours[task][metric] == pytest.approx(hf[task][metric], rel=1e-4), (task, metric)


def test_generate_until_replans_and_stops(folders, synthetic_random):
    ours = PlannedLMEval(model_dir=str(folders / "ours"), prepared_dir=str(synthetic_random), num_paths=2)
    context = PreparedDataset(synthetic_random).split("test").articles[0]["text"][:60]
    kwargs = {"until": ["."], "max_gen_toks": 12, "do_sample": True, "temperature": 1.0}
    out = ours.generate_until([Instance("generate_until", {}, (context, kwargs), 0)])
    assert len(out) == 1 and "." not in out[0]


def test_bad_model_args_are_one_line(folders, synthetic_random, tmp_path):
    cases = [({"model_dir": str(folders / "none"), "num_path": 3}, "num_path"),
             ({"model_dir": str(tmp_path)}, "model_dir"),
             ({"model_dir": "planlm-test/not-cached"}, "not-cached"),
             ({"model_dir": str(folders / "oracle"), "prepared_dir": str(tmp_path)}, "prepared_dir"),
             ({"model_dir": str(folders / "oracle"), "prepared_dir": str(synthetic_random), "horizon": 9}, "horizon")]
    for args, named in cases:
        with pytest.raises(PlanlmError) as error:
            PlannedLMEval.create_from_arg_obj(args)
        assert named in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_importing_the_harness_leaves_the_exception_hook_alone():
    code = "import sys; hook = sys.excepthook; import planlm.evaluate.lm_harness; assert sys.excepthook is hook"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr


def test_uncaught_planlm_errors_print_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)  # importing planlm leaves the hook alone ...
    assert not getattr(sys.excepthook, "planlm_one_line", False)
    with pytest.raises(PlanlmError):
        PlannedLMEval.create_from_arg_string("model_dir")  # ... lm-eval making the model installs it
    sys.excepthook(PlanlmError, PlanlmError("model_args model_dir=x: no model here"), None)
    assert capsys.readouterr().err == "planlm: error: model_args model_dir=x: no model here\n"


@pytest.mark.slow  # a fresh interpreter importing torch, transformers and lm-eval
def test_the_command_line_prints_one_line(folders, synthetic_random, tmp_path):
    tasks = write_local_tasks(tmp_path, synthetic_random)
    command = [sys.executable, "-m", "planlm.evaluate.lm_harness", "--model", "planlm", "--model_args",
               f"model_dir={tmp_path}", "--tasks", "planlm_local_ppl", "--include_path", str(tasks)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"planlm: error: model_args model_dir={tmp_path}")
    command[6] = f"model_dir={folders / 'none'}"  # a model: lm-eval's table (its default device is cuda: the CPU here)
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "planlm_local_ppl" in run.stdout and "word_perplexity" in run.stdout


def test_generation_stops_at_a_stop_string(synthetic_random):
    from helpers import chatty_planned_lm

    from planlm.evaluate.generate import generate_text
    from planlm.evaluate.generator import SamplingConfig

    model = chatty_planned_lm(PreparedDataset(synthetic_random))
    tokenizer = model.load_tokenizer()
    full = generate_text(model, tokenizer, "Red water.", sampling=SamplingConfig(max_new_tokens=30))  # seed 0
    stopped = generate_text(model, tokenizer, "Red water.", sampling=SamplingConfig(max_new_tokens=30), stop=["water"])
    assert "water" in full.text[:-5] and len(full.token_ids) == 30
    assert stopped.text.endswith("water") and stopped.text.count("water") == 1 and full.text.startswith(stopped.text)
