"""planlm/ is the product: its text (docstrings, comments, ``--help``, messages) says what the code does and why,
never the project's history. No issue number anywhere in it, and no commit hash in a docstring or a comment (a hex
string literal in code may be data: a digest, a fixture). The LICENSE and CITATION.cff agree with pyproject.toml."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "planlm"
ISSUE = re.compile(r"\bissues? #?\d+", re.I)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")  # hex with a letter and a digit


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring (a string statement: module, class, function or attribute docstring) and
    every comment of a Python source."""
    strings = [node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Expr)
               and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]
    found = [(string.lineno, string.value) for string in strings]
    found += [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT]
    return found


def history(source: str) -> list[str]:
    """Where a source names an issue (anywhere) or a commit (in its prose): 'line: match' each."""
    issues = [f"{n}: {m.group()}" for n, line in enumerate(source.splitlines(), 1) for m in ISSUE.finditer(line)]
    commits = [f"{n}: {m.group()}" for n, text in prose(source) for m in COMMIT.finditer(text)]
    return issues + commits


def test_the_package_names_no_issue_and_no_commit():
    found = [f"{path.relative_to(ROOT)}:{where}" for path in sorted(PACKAGE.rglob("*.py"))
             for where in history(path.read_text())]
    assert not found, "lab history in planlm/ (say what the code does and why instead): " + "; ".join(found)


def test_the_check_finds_issues_and_commits_in_prose_but_not_hex_data():
    source = ('"""Pieces of the planner\'s corpus (issue 36)."""\n'
              'x = 1  # fixed in c54ee7c\n'
              'def f():\n'
              '    """As Issues #12 asked."""\n'
              'DIGEST = "3f2a9c1d0b"  # data, not a commit\n'
              'DATE = "20231101"  # digits alone are not a hash\n'
              '# a decade ago, deadbeef and effaced are words\n')
    assert history(source) == ["1: issue 36", "4: Issues #12", "2: c54ee7c"]


def test_the_license_and_the_citation_match_the_package():
    project = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "(.+)"$', project, re.M).group(1)
    assert 'license = { text = "Apache-2.0" }' in project
    assert (ROOT / "LICENSE").read_text().split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "Apache-2.0"
    assert str(citation["version"]) == version  # bump both together
    paper = citation["preferred-citation"]
    assert paper["title"] == "Learning to Plan Long-Term for Language Modeling"
    assert [a["family-names"] for a in paper["authors"]] == ["Mai", "Cornille", "Moens"]


def test_the_cli_stays_within_its_flag_budget_and_every_flag_is_documented():
    """At most 264 flags over all commands (an option earns its place by a use docs/results.md shows, one a
    Lightning or Hugging Face user expects, the fields of a user's own adapter: --adapter.options, or the run
    folders that planlm across-runs compares and the compute it carries their line to, as the ladder's
    extrapolation does), each with a help text in docs/configuration.md."""
    from planlm.commands import COMMANDS
    from planlm.config_docs import command_flags

    flags = {name: command_flags(name) for name in COMMANDS}
    assert sum(len(names) for names in flags.values()) <= 264, {name: len(names) for name, names in flags.items()}
    page = (ROOT / "docs" / "configuration.md").read_text()
    undocumented = [f"{name} {flag}" for name, names in flags.items() for flag in names
                    if re.search(rf"\| `{re.escape(flag)}` \|[^|]*\|[^|]*\|\s*\|", page)]
    assert not undocumented, undocumented
