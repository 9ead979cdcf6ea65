"""`planlm run` with a base_lm section: the plain LM is trained once (lm/_base) and every condition starts from it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_run_config
from planlm.pipeline.run import run
from planlm.stage import read_manifest


@pytest.mark.slow  # a real (tiny) prepare with the sentence encoder, then three LMs
def test_base_lm_stage_trains_once_and_every_condition_starts_from_it(tmp_path):
    out = tmp_path / "run"
    config = tiny_run_config(out, base_lm={"train": {"max_steps": 3}}, edit_distance=None, sweeps=[],
                             conditions=[{"name": "none", "plans": {"kind": "none"}},
                                         {"name": "oracle", "plans": {"kind": "oracle"},
                                          "model": {"finetune": "frozen"}}])
    config["lm"]["train"]["max_steps"] = 2
    run(**config)
    state = json.loads((out / "run_state.json").read_text())["stages"]
    assert state["train-lm _base"]["status"] == "done" and state["train-lm _base"]["ran_now"]
    assert list(state).index("train-lm _base") < list(state).index("train-lm none")
    base = read_manifest(out / "lm" / "_base")
    assert base["conditioning"] == "none" and base["global_step"] == 3  # base_lm's own settings over lm's
    base_lm = load_file(str(out / "lm" / "_base" / "lm" / "model.safetensors"))
    for name in ("none", "oracle"):
        manifest = read_manifest(out / "lm" / name)
        assert manifest["config"]["model"]["init_from"] == str(out / "lm" / "_base") and manifest["global_step"] == 2
    # The frozen condition trained only its adapter: its LM is the base LM, bit for bit.
    oracle_lm = load_file(str(out / "lm" / "oracle" / "lm" / "model.safetensors"))
    for tensor_name, tensor in base_lm.items():
        torch.testing.assert_close(oracle_lm[tensor_name], tensor, rtol=0, atol=0)
    # The plain condition continued training from the base: it moved away from it.
    none_lm = load_file(str(out / "lm" / "none" / "lm" / "model.safetensors"))
    assert not torch.equal(none_lm["transformer.h.0.mlp.c_fc.weight"], base_lm["transformer.h.0.mlp.c_fc.weight"])
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["conditions"]}
    assert rows["none"]["status"] == rows["oracle"]["status"] == "done"
