"""The folders and files of one `planlm run`, named once for the pipeline that writes them and the report
that reads them::

    prepared/                  planlm prepare
    codebooks/seed<N>/         planlm codebook: prepared/ with one seed's codebook (seed_draws: method)
    planner/                   planlm train-planner (+ planner/plans/... caches, planlm sample-plans)
    planners/<condition>/      a condition's own planner (optional)
    lm/_base/                  a plain LM pretrained once, the start of every condition (optional)
    lm/<condition>/            planlm train-lm, one per condition
    eval/<condition>/          planlm evaluate
    edit/<condition>/          planlm edit-distance (optional)
    sweeps/<condition>-<kind>/ planlm sweep (optional)
    actions/                   planlm actions, for the report
    logs/                      each stage's library output (and a failed stage's traceback): planlm.console
    run_state.json, report.md, results.json, results.csv, figures/

With ``seeds``, the folders of the base LM and of each condition's LM, evaluation and edit distance hold
one ``seed<N>/`` folder per seed; with ``seed_draws: method`` the planners' folders (planner/,
planners/<condition>/) and the sweeps' (sweeps/<condition>-<kind>/) do too, and every stage of a seed reads its
own codebook (codebooks/seed<N>/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

BASE_LM = "_base"


@dataclass(frozen=True)
class RunLayout:
    """Paths under one run folder."""

    root: Path

    @property
    def prepared(self) -> Path:
        return self.root / "prepared"

    @property
    def planner(self) -> Path:
        """The planner shared by the conditions without a planner section of their own."""
        return self.root / "planner"

    def codebook(self, seed: int) -> Path:
        """The prepared corpus with one seed's codebook (``seed_draws: method``; ``planlm codebook``)."""
        return self.root / "codebooks" / f"seed{seed}"

    def planner_at(self, seed: Optional[int] = None) -> Path:
        """The shared planner of one seed (``seed_draws: method``), or the one shared by every seed (None)."""
        return _seed_dir(self.planner, seed)

    def own_planner(self, condition: str, seed: Optional[int] = None) -> Path:
        return _seed_dir(self.root / "planners" / condition, seed)

    def lm(self, condition: str, seed: Optional[int] = None) -> Path:
        return _seed_dir(self.root / "lm" / condition, seed)

    def evaluation(self, condition: str, seed: Optional[int] = None) -> Path:
        return _seed_dir(self.root / "eval" / condition, seed)

    def edit_distance(self, condition: str, seed: Optional[int] = None) -> Path:
        return _seed_dir(self.root / "edit" / condition, seed)

    @property
    def sweeps(self) -> Path:
        return self.root / "sweeps"

    def sweep(self, condition: str, kind: str, seed: Optional[int] = None) -> Path:
        return _seed_dir(self.sweeps / f"{condition}-{kind}", seed)

    @property
    def actions(self) -> Path:
        return self.root / "actions"

    def stage_log(self, stage: str) -> Path:
        return self.root / "logs" / f"{stage.replace(' ', '_')}.txt"

    @property
    def state(self) -> Path:
        return self.root / "run_state.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def results_json(self) -> Path:
        return self.root / "results.json"

    @property
    def results_csv(self) -> Path:
        return self.root / "results.csv"

    @property
    def figures(self) -> Path:
        return self.root / "figures"


def _seed_dir(folder: Path, seed: Optional[int]) -> Path:
    """``folder/seed<N>`` for one training seed, ``folder`` itself for a run without ``seeds``."""
    return folder if seed is None else folder / f"seed{seed}"
