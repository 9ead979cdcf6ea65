"""Every artifact gets the mode a plain open() / mkdir() gives under the process umask, also those that libraries
write through a private temporary file (safetensors: 0600) or folder (tempfile.mkdtemp: 0700).

Each umask runs in a process of its own, set before anything is imported: fsspec (Lightning's checkpoint writer)
reads the umask once per process."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from planlm.files import process_umask

WRITERS = """
import os, sys
os.umask(int(sys.argv[2], 8))
from pathlib import Path
from helpers import tiny_gpt2_config, tiny_planned_lm, tiny_planner
from planlm.data.artifacts import PreparedDataset
from planlm.data.bpe import train_bpe
from planlm.data.resources import load_tokenizer
from planlm.testing.synthetic import make_synthetic_prepared
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

out = Path(sys.argv[1])
prepared_dir = make_synthetic_prepared(out / "prepared", rule="random", seed=1,
                                       num_articles={"train": 12, "validation": 4, "test": 4})
prepared = PreparedDataset(prepared_dir)
tiny_planner(prepared).save_pretrained(out / "planner")
tiny_planned_lm(prepared).save_pretrained(out / "planned", tokenizer=load_tokenizer("gpt2"))
train_bpe(["one text of a few words.", "another text, with more words in it."] * 4, 300, out / "bpe")
train_lm(str(prepared_dir), str(out / "lm"), model=LMModelConfig(model_config=tiny_gpt2_config()),
         train=LMTrainConfig(batch_size=4, max_epochs=1, limit_train_batches=1, limit_val_batches=1))
"""


def wrong_modes(root: Path, mask: int) -> list[str]:
    """'mode path' of every file and folder under ``root`` whose mode is not what the umask gives."""
    wrong = []
    for path in root.rglob("*"):
        want = (0o777 if path.is_dir() else 0o666) & ~mask
        if stat.S_IMODE(path.stat().st_mode) != want:
            wrong.append(f"{stat.S_IMODE(path.stat().st_mode):o} {path.relative_to(root)}")
    return wrong


def test_process_umask_reads_the_mask():
    before = os.umask(0o027)
    try:
        assert process_umask() == 0o027
    finally:
        os.umask(before)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_artifact_honours_the_umask(tmp_path, umask):
    """Prepared codebook, planner, planned LM (with its HF model and tokenizer), a trained BPE and a whole train-lm
    stage (checkpoints, logger files, model card) under umask 022 and 077."""
    tests = Path(__file__).parent
    out = tmp_path / "artifacts"
    result = subprocess.run([sys.executable, "-c", WRITERS, str(out), f"{umask:o}"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "lm" / "lm" / "model.safetensors").is_file() and (out / "planner" / "model.safetensors").is_file()
    assert wrong_modes(out, umask) == []
