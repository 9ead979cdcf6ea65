"""The run report: ``report.md`` + PNG figures + machine-readable ``results.json`` / ``results.csv``.

It only reads what the stages wrote (``eval/<condition>/metrics.json``, ``edit/<condition>/metrics.json``,
``planner/summary.json``, ``sweeps/``, ``prepared/``: the folders of ``planlm.pipeline.layout``), so it can be
rebuilt at any time with ``python -m planlm.pipeline.report RUN_DIR``. The numbers come from
``planlm.pipeline.results``, the Markdown from ``planlm.pipeline.tables``, the figures from
``planlm.pipeline.figures``.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Optional

from planlm.pipeline import tables
from planlm.pipeline.figures import copy_figure
from planlm.pipeline.layout import RunLayout
from planlm.pipeline.results import (collect_results, contrast_rows, corpus_numbers, planner_summaries, position_rows,
                                     read_json, seeded_sweeps)


def _actions(layout: RunLayout, actions_shown: int) -> list[str]:
    """Describe the prepared corpus's writing actions (into ``actions/``) and show the largest ``actions_shown``."""
    prepared = layout.prepared
    if not (prepared / "manifest.json").is_file() or actions_shown <= 0:
        return []
    import contextlib
    import io

    from planlm.data.actions import describe_actions

    with contextlib.redirect_stdout(io.StringIO()):  # the report shows them; the terminal need not
        folder = describe_actions(str(prepared), out_dir=str(layout.actions), num_nearest=3, max_print=0)
    described = read_json(folder / "actions.json") or {"actions": []}
    figure = copy_figure(folder / "cluster_sizes.png", layout.figures / "cluster_sizes.png")
    return tables.actions_section(described, actions_shown, figure)


def write_report(run_dir: str | Path, *, conditions: list[dict], state: Optional[dict] = None,
                 seeds: Optional[list[int]] = None, actions_shown: int = 5,
                 contrasts: Optional[list[list[str]]] = None) -> Path:
    """Write report.md, results.json, results.csv and figures/ in ``run_dir``; return report.md's path.

    ``contrasts``: pairs [b, a] of condition names whose paired difference ppl(b) - ppl(a) gets a row of its own
    (e.g. [ours, ours_t1] for the paper's claim that planning T steps ahead helps)."""
    layout = RunLayout(Path(run_dir))
    layout.figures.mkdir(parents=True, exist_ok=True)
    rows = collect_results(layout.root, conditions, state, seeds)
    paired = contrast_rows(layout, rows, contrasts or [])
    positions = position_rows(layout, rows, paired)
    summaries = planner_summaries(layout)
    seeded = seeded_sweeps(layout)
    planners = {name: {"horizon": summary["horizon"], "information": summary["information"],
                       "information_split": summary["information_split"],
                       **({"seed": summary["seed"]} if summary.get("seed") is not None else {})}
                for name, summary in summaries.items()}
    stages = (state or {}).get("stages", {})
    layout.results_json.write_text(json.dumps({"conditions": rows, "contrasts": paired, "positions": positions,
                                               "planners": planners, "paper": tables.PAPER_TABLE, "stages": stages,
                                               **({"sweeps": seeded} if seeded else {})}, indent=2))
    with open(layout.results_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)) or ["name"])
        writer.writeheader()
        writer.writerows(rows)
    lines = tables.header(layout.root.name, rows)
    lines += tables.corpus_line(corpus_numbers(layout, rows))
    lines += tables.results_table(rows)
    lines += tables.table_notes(rows)
    lines += tables.contrasts_section(paired)
    lines += tables.positions_section(positions)
    lines += tables.planner_section(summaries, layout.figures)
    lines += tables.sweeps_section(layout, seeded)
    lines += _actions(layout, actions_shown)
    lines += tables.stages_section(stages)
    layout.report.write_text("\n".join(lines) + "\n")
    return layout.report


if __name__ == "__main__":  # rebuild a report: python -m planlm.pipeline.report RUN_DIR
    run = RunLayout(Path(sys.argv[1]))
    state = read_json(run.state) or {}
    config = state.get("config") or {}
    print(write_report(run.root, conditions=config.get("conditions") or [], state=state, seeds=config.get("seeds"),
                       **(config.get("report") or {})))
