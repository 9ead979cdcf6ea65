"""The loggers of the ``train-*`` commands' ``--train.loggers``: csv and tensorboard by default; wandb, mlflow,
comet or any Lightning Logger class (``module.Class``) when its package is installed."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import NamedTuple

import lightning as L

from planlm.errors import PlanlmError

DEFAULT_LOGGERS = ("csv", "tensorboard")


class LoggerSpec(NamedTuple):
    """A Lightning logger by name: its class, the modules it needs (any one of them) and their pip package."""

    class_path: str
    modules: tuple[str, ...]
    package: str


LOGGERS = {
    "csv": LoggerSpec("lightning.pytorch.loggers.CSVLogger", (), "lightning"),
    "tensorboard": LoggerSpec("lightning.pytorch.loggers.TensorBoardLogger", ("tensorboard", "tensorboardX"),
                              "tensorboard"),
    "wandb": LoggerSpec("lightning.pytorch.loggers.WandbLogger", ("wandb",), "wandb"),
    "mlflow": LoggerSpec("lightning.pytorch.loggers.MLFlowLogger", ("mlflow",), "mlflow"),
    "comet": LoggerSpec("lightning.pytorch.loggers.CometLogger", ("comet_ml",), "comet-ml"),
}


def check_loggers(names: list[str], flag: str) -> None:
    """One-line errors for a logger name that is not known or whose package is not installed."""
    for name in names:
        _logger_class(name, flag)


def _logger_class(name: str, flag: str) -> type:
    spec = LOGGERS.get(name)
    if spec is None and "." not in name:
        raise PlanlmError(f"{flag}: unknown logger {name!r}; choose from {', '.join(LOGGERS)} or give a Logger "
                          f"class path (module.Class)")
    if spec is not None and spec.modules and not any(importlib.util.find_spec(m) for m in spec.modules):
        raise PlanlmError(f"{flag}: logger {name!r} needs the {spec.package} package; `pip install {spec.package}` "
                          f"or leave {name} out of {flag}")
    module_name, _, class_name = (spec.class_path if spec else name).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise PlanlmError(f"{flag}: cannot import logger class {name!r} ({error}); install its package or fix "
                          f"the path") from None
    if not (inspect.isclass(cls) and issubclass(cls, L.pytorch.loggers.Logger)):
        raise PlanlmError(f"{flag}: {name!r} is not a lightning.pytorch.loggers.Logger class")
    return cls


def make_loggers(names: list[str], out: Path, folders: dict[str, str], flag: str = "--train.loggers") -> list:
    """The loggers of a run writing under ``out``: csv and tensorboard into ``out/folders[name]``, mlflow's
    file store into ``out/mlruns``, wandb's files into ``out``; a class path gets save_dir=out if it takes one."""
    loggers = []
    for name in names:
        cls = _logger_class(name, flag)
        if name in ("csv", "tensorboard"):
            loggers.append(cls(out, name=folders[name]))
        elif name == "mlflow":
            loggers.append(cls(run_name=out.name, save_dir=str(out / "mlruns")))
        elif name == "wandb":
            loggers.append(cls(name=out.name, save_dir=str(out)))
        elif "save_dir" in inspect.signature(cls).parameters:
            loggers.append(cls(save_dir=str(out)))
        else:
            loggers.append(cls())
    return loggers
