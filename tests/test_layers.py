"""The import layers of planlm (issue 31, item 4): the contracts of ``.importlinter`` hold, so an import circle or
an import from a higher layer (data -> models, models -> train, ...) fails the suite, not only a reader's eye."""

from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the test extra: pip install -e .[test]")
from importlinter.application.use_cases import lint_imports  # noqa: E402
from importlinter.configuration import configure  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / ".importlinter"


def test_import_contracts_are_kept(capsys):
    configure()  # what the lint-imports command does first: its readers of .importlinter and pyproject.toml
    kept = lint_imports(config_filename=str(CONFIG), cache_dir=None, no_logo=True)
    report = capsys.readouterr().out
    assert kept, f"an import breaks planlm's layers or makes a circle (see {CONFIG.name}):\n{report}"
    assert "2 kept, 0 broken" in report
