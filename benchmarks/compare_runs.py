"""Compare the numbers of two `planlm run` folders, timings and paths left out.

Used to check that a change of code keeps behaviour (the same config before and after must give
the same perplexities to the last printed digit):

    python benchmarks/compare_runs.py RUN_BEFORE RUN_AFTER

Every file of the first run is compared with the same path in the second (which may hold more, e.g. more
seeds): each metrics.json, per_article.csv, per_boundary.csv and planner summary.json value for value,
and each model.safetensors byte for byte. A name that planlm now records under another name (``RENAMED``) is
the same value. Prints the differences (path, before, after, relative
difference), then every evaluation's perplexity in both runs as the report prints it (2 decimals).
Exit status 1 when a printed perplexity differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

SKIP = {"wall_time_s", "tokens_per_s", "plan_time_s", "lm_time_s", "planner_time_s", "adapter_time_s",
        "eval_wall_time_s", "relative_eval_time", "cache_planner_time_s", "train_wall_time_s", "created",
        "model_dir", "prepared_dir", "planner_dir", "plans_dir", "eval_dir", "relative_wall_time", "device"}
JSON_FILES = ("metrics.json", "summary.json")
RENAMED = {"path_policy.kind": {"fixed": "all"}}
"""Recorded names that planlm writes under another name now (key: the end of the JSON path): the path policy that
gives every boundary K is ``all``, formerly ``fixed``."""
TEXT_FILES = ("per_article.csv", "per_boundary.csv")


def walk(a, b, path: str, out: list[tuple]) -> None:
    """Append (path, a, b) for every leaf where the two JSON values differ (keys in SKIP left out)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in SKIP:
                walk(a.get(key), b.get(key), f"{path}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{index}]", out)
    elif a != b and not any(path.endswith(f".{key}") and names.get(a, a) == names.get(b, b)
                            for key, names in RENAMED.items()):
        out.append((path, a, b))


def relative(a, b) -> float | None:
    """|a - b| / |a| for two numbers, else None."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and a:
        return abs(a - b) / abs(a)
    return None


def compare(before: Path, after: Path) -> tuple[int, list[tuple]]:
    """(files compared, differences) over the files of ``before``."""
    diffs: list[tuple] = []
    files = sorted(f for name in JSON_FILES + TEXT_FILES + ("model.safetensors",) for f in before.rglob(name))
    for file in files:
        where = str(file.relative_to(before))
        other = after / file.relative_to(before)
        if not other.is_file():
            diffs.append((where, "present", "missing"))
        elif file.suffix == ".json":
            walk(json.loads(file.read_text()), json.loads(other.read_text()), where, diffs)
        elif file.suffix == ".safetensors":
            if hashlib.sha256(file.read_bytes()).digest() != hashlib.sha256(other.read_bytes()).digest():
                diffs.append((where, "weights", "differ"))
        elif file.read_text() != other.read_text():
            diffs.append((where, "csv", "differs"))
    return len(files), diffs


def printed_perplexities(before: Path, after: Path) -> list[tuple[str, float, float]]:
    """(evaluation folder, ppl before, ppl after) of every eval/**/metrics.json of ``before``."""
    rows = []
    for file in sorted((before / "eval").rglob("metrics.json")):
        other = after / file.relative_to(before)
        ppl_after = json.loads(other.read_text()).get("ppl", math.nan) if other.is_file() else math.nan
        rows.append((str(file.parent.relative_to(before)), json.loads(file.read_text()).get("ppl", math.nan),
                     ppl_after))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--show", type=int, default=40, help="differences printed at most")
    args = parser.parse_args()
    count, diffs = compare(args.before, args.after)
    print(f"{count} files compared; {len(diffs)} differences")
    for path, a, b in diffs[:args.show]:
        rel = relative(a, b)
        print(f"  {path}: {a!r} -> {b!r}" + (f"  (relative {rel:.1e})" if rel is not None else ""))
    changed = 0
    print(f"{'evaluation':<28} {'ppl before':>12} {'ppl after':>12}  printed equal")
    for name, a, b in printed_perplexities(args.before, args.after):
        same = f"{a:.2f}" == f"{b:.2f}"
        changed += not same
        print(f"{name:<28} {a:>12.6f} {b:>12.6f}  {'yes' if same else 'NO'}")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
