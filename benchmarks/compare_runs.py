"""Compare the numbers of two `planlm run` folders, ignoring timings and paths: every metrics.json,
per_article.csv, per_boundary.csv, planner summary.json and the report's results.json.

Used to check that a change of code keeps behaviour (issue 11: the same config before and after must
give the same perplexities to the last digit):

    python benchmarks/compare_runs.py RUN_BEFORE RUN_AFTER

Prints how many files were compared, every difference (path, before, after) and each condition's
perplexity, paired difference, plan usage and edit distance in the first run.
"""

import json
import sys
from pathlib import Path
old, new = Path(sys.argv[1]), Path(sys.argv[2])
SKIP = {"wall_time_s","tokens_per_s","plan_time_s","lm_time_s","planner_time_s","adapter_time_s","eval_wall_time_s",
        "relative_eval_time","cache_planner_time_s","train_wall_time_s","created","model_dir","prepared_dir",
        "planner_dir","plans_dir","eval_dir","relative_wall_time","device"}
def walk(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in SKIP: continue
            walk(a.get(k), b.get(k), f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)): walk(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append((path, a, b))
diffs, n = [], 0
for f in sorted(old.rglob("metrics.json")):
    g = new / f.relative_to(old)
    n += 1
    if not g.is_file(): diffs.append((str(f.relative_to(old)), "present", "missing")); continue
    walk(json.loads(f.read_text()), json.loads(g.read_text()), str(f.relative_to(old)), diffs)
for f in sorted(old.rglob("per_article.csv")) + sorted(old.rglob("per_boundary.csv")):
    g = new / f.relative_to(old); n += 1
    if f.read_text() != g.read_text(): diffs.append((str(f.relative_to(old)), "csv", "differs"))
for f in sorted(old.rglob("summary.json")):
    g = new / f.relative_to(old); n += 1
    walk(json.loads(f.read_text()), json.loads(g.read_text()), str(f.relative_to(old)), diffs)
ro, rn = json.loads((old/"results.json").read_text()), json.loads((new/"results.json").read_text())
walk(ro["conditions"], rn["conditions"], "results.conditions", diffs)
print(f"{n} files compared; {len(diffs)} differences")
for d in diffs[:40]: print(d)
for r in ro["conditions"]:
    print(f"{r['name']:>10} ppl {r['ppl']!r}  paired {r.get('paired_diff')!r}  usage {r.get('plan_usage_ppl')!r}  edit {r.get('edit')!r}")
