"""The documentation holds: every relative link and image in README.md, docs/ and experiments/ resolves (anchors
included), and every ``planlm ...`` command line quoted in a fenced code block parses with the real CLI parser
(jsonargparse, the parser ``planlm`` itself builds, without running the command)."""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PLACEHOLDER = "..."  # "planlm sample-plans ... --num_paths 50": the arguments shown before stand for the rest


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    ids: dict[str, int] = {}
    for line in FENCE.sub("", path.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            ids[slug if slug not in ids else f"{slug}-{ids[slug]}"] = ids.get(slug, 0) + 1
    return set(ids)


def links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`(?!\])", "", text)  # inline code is not a link, unless it is a link's text
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto:


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_and_image_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page_id(page)}: " + "; ".join(broken)


def command_lines(path: Path) -> list[str]:
    """Each ``planlm ...`` command of the page's fenced blocks: continuations joined, comments and chains
    (``pip install ... && planlm run ...``) stripped. A ``text`` block is output (a console), not commands."""
    commands = []
    for block in FENCE.findall(path.read_text()):
        if block.startswith("```text"):
            continue
        for line in block.replace("\\\n", " ").splitlines()[1:-1]:
            for part in line.split("&&"):
                if part.strip().startswith("planlm "):
                    commands.append(shlex.split(part, comments=True))
    return commands


@pytest.fixture(scope="module")
def cli_parser():
    from jsonargparse import CLI, capture_parser, set_parsing_settings

    from planlm.commands import COMMANDS, load_command

    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # as planlm.cli.main
    commands = {name: load_command(name) for name in COMMANDS}
    return commands, capture_parser(lambda: CLI(commands, args=[], as_positional=False, fail_untyped=True))


def parse_error(cli_parser, words: list[str]) -> str | None:
    """None if the command line parses, else the parser's error line (or planlm's, for an overlay config given
    before its base)."""
    from planlm.cli import _read_overlays, config_argv
    from planlm.errors import PlanlmError

    commands, parser = cli_parser
    try:  # as planlm.cli.main: `planlm run`'s configs and flags merged, an overlay's marker no option of the command
        args = config_argv(words[1:], commands[words[1]]) if words[1:] and words[1] in commands else \
            _read_overlays(words[1:])
    except PlanlmError as e:
        return str(e)
    if PLACEHOLDER in args and args[0] in commands:
        args.remove(PLACEHOLDER)
        given = {a[2:].split("=")[0] for a in args if a.startswith("--")}
        required = [name for name, p in inspect.signature(commands[args[0]]).parameters.items()
                    if p.default is inspect.Parameter.empty and name not in given]
        args += [arg for name in required for arg in (f"--{name}", "placeholder")]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parser.parse_args(args)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    return None


def test_every_quoted_planlm_command_parses(cli_parser):
    quoted = [(page, words) for page in PAGES for words in command_lines(page)]
    assert len(quoted) >= 15  # the README's and the docs' examples were found
    errors = [f"{page_id(page)}: {shlex.join(words)}: {error}" for page, words in quoted
              if (error := parse_error(cli_parser, words))]
    assert not errors, "\n".join(errors)


def test_a_misspelled_option_fails_the_parse(cli_parser):
    good = ["planlm", "evaluate", "--model_dir", "m", "--prepared_dir", "p", "--out_dir", "o", "--plans.num_paths", "5"]
    assert parse_error(cli_parser, good) is None
    assert "--plans.num_pathz" in parse_error(cli_parser, [w.replace("num_paths", "num_pathz") for w in good])
    assert parse_error(cli_parser, ["planlm", "sample-plans", PLACEHOLDER, "--plans.num_paths", "5"]) is None
    assert parse_error(cli_parser, ["planlm", "sample-plans", PLACEHOLDER, "--plans.num_pathz", "5"])


def test_the_configuration_page_lists_every_key_of_every_command_and_is_current():
    """docs/configuration.md is written from the signatures and dataclasses (`python -m planlm.config_docs`)."""
    from planlm.commands import COMMANDS
    from planlm.config_docs import PAGE, command_flags, render

    page = render()
    for name in COMMANDS:  # every flag of the CLI is a row of its command's table
        section = page.split(f"## planlm {name}\n")[1].split("\n## ")[0]
        assert all(f"| `{flag}` |" in section for flag in command_flags(name)), name
    assert PAGE.read_text() == page, "docs/configuration.md is stale: run `python -m planlm.config_docs`"


@pytest.mark.parametrize("page, limit", [("README.md", 150), ("docs/results.md", 330)])
def test_the_front_pages_stay_short(page, limit):
    """The README says what planlm does, its two commands, the answer in one table, your corpus, the API and the docs
    map; the results page the current evidence, one table per claim. Superseded tables go to lab/."""
    lines = (ROOT / page).read_text().count("\n")
    assert lines <= limit, f"{page}: {lines} lines, at most {limit}; move superseded text to lab/ or docs/"


def test_the_readme_gives_the_smoke_run_first_and_the_exact_install():
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install and run")[1].split("\n## ")[0]
    assert install.index("configs/smoke.yaml") < install.index("configs/demo.yaml")
    assert "pip install -r requirements.lock" in install and (ROOT / "requirements.lock").is_file()
    assert "EPYC" not in readme and "avx512" not in readme  # machines and their times: docs/benchmarks.md
