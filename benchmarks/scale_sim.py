"""The whole pipeline at a given corpus size, each stage in its own process: wall time, peak memory and disk per stage,
and what they extrapolate to at the paper's 285,310 articles and at 6.4M (all of English Wikipedia).

A simulation that runs on a small machine: the corpus is generated (paper-shaped: about 35 sentences per article,
real sentences resampled from the shipped corpora; ``scale_sim_data.py``), the sentence encoder is a hashing bag of
words installed in the ``prepare`` process (fast and deterministic; not a product option), and the networks are tiny
and train a fixed number of steps. Everything else is the product: each stage is its real Python entry point on the
real data path (spaCy splitting, the embedding files, faiss k-means with the paper's fit sample, GPT-2 tokens, the
planner's and the LM's data loading, plans for every boundary of every split, perplexity), so what grows with the
corpus grows here as it would at full size.

The stages, in order, each in a child process of its own (so its peak RSS is its own):

1. ``corpus``: write N + 2 x ``--heldout`` articles (and a margin for the skips) as JSONL;
2. ``prepare``: ``planlm.data.prepare.prepare`` (N train, ``--heldout`` validation and test articles, whole
   articles, ``--num_actions`` actions, ``--fit_sample``, ``--tokenizer``);
3. ``train-planner``: ``train_planner``, a 16-wide planner (T = 10, batch 512) for ``--planner_steps`` steps;
4. ``sample-plans``: ``sample_plans``, K = 10 paths of T = 10 for every boundary of every split;
5. ``train-lm``: ``train_lm``, a tiny GPT-2 with the multipath adapter on the cached plans, ``--lm_steps`` steps;
6. ``evaluate``: ``evaluate``, perplexity with the cached plans on ``--eval_articles`` test articles.

For each, the parent records the wall time, the peak RSS (``os.wait4``'s ``ru_maxrss`` of that child), the peak of
its anonymous memory (sampled in the child from /proc/self/status every 0.1 s: RSS less the memory-mapped files'
pages, which the kernel can drop), the disk its folder holds, and the child's phases (the product functions each
stage spends its time in, with the memory after each). Results go to ``<out_dir>/n<N>/records/<stage>.json``; a
stage already measured is skipped (resumable), and re-measuring one drops the records of the stages after it. While a
stage runs, the parent keeps its figures so far in ``records/<stage>.attempts.json`` (every 10 s); a measurement of
``prepare`` or ``sample-plans`` cut short (the machine taken away) is continued by the next call, the stage resuming
from its own records, and its attempts are added up (the report says how many).

    python benchmarks/scale_sim.py --sizes 3000 30000 100000 --out_dir runs/scale_sim

and a smoke size (minutes, most of them in sample-plans):

    nice -n 19 python benchmarks/scale_sim.py --sizes 200 800 --heldout 20 --num_actions 64 --embedding_dim 384
        --planner_steps 5 --lm_steps 5 --eval_articles 5 --eval_stride 127 --out_dir /tmp/scale_sim

It prints (and writes to ``<out_dir>/report.md`` and ``results.json``) a table row per size and stage, each stage's
growth from the middle to the largest size (RSS ratio, MB and seconds per 1,000 articles) and a linear
extrapolation through those two sizes to ``--extrapolate`` (285,310 and 6,400,000 articles by default). Settings
other than the sizes are kept in ``<out_dir>/settings.json``; another setting needs another ``--out_dir``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

STAGES = ("corpus", "prepare", "train-planner", "sample-plans", "train-lm", "evaluate")
FOLDERS = {"corpus": "corpus", "prepare": "prepared", "train-planner": "planner", "sample-plans": "plans",
           "train-lm": "lm", "evaluate": "eval"}
# Stages that resume from their own records when rerun (an interrupted measurement of one is continued, not restarted).
RESUMABLE = ("prepare", "sample-plans")
PAPER_ARTICLES = 285_310
WIKIPEDIA_ARTICLES = 6_400_000
MB = 1 << 20


@dataclass
class Settings:
    """What a measurement depends on besides the size (kept in <out_dir>/settings.json)."""

    heldout: int = 100
    """Validation and test articles each (fixed across sizes, as the paper's 1,000 / 1,000)."""
    mean_sentences: float = 35.0
    """Mean sentences per generated article (the paper's Wikipedia: about 35; spaCy finds about as many in them). The
    tail is long: a few hundred articles have a mean anywhere from about 32 to 38."""
    embedding_dim: int = 768
    """Width of the stand-in sentence embeddings (the paper's all-mpnet-base-v2: 768)."""
    num_actions: int = 1024
    fit_sample: int | None = 2_000_000
    """prepare.actions.fit_sample: the k-means fit's in-RAM copy is capped at this many sentences."""
    tokenizer: str = "gpt2"
    planner_width: int = 16
    """The planner's d_model (its feed-forward twice that): the networks' compute is not what the simulation
    measures, and sampling K x T steps for every boundary dominates the CPU time."""
    planner_dynamics: str = "causal"
    """The planner's g: causal (a key/value cache: the cheapest to sample) or recurrent (the paper's)."""
    planner_steps: int = 200
    planner_batch_size: int = 512
    lm_steps: int = 200
    lm_batch_size: int = 32
    num_paths: int = 10
    horizon: int = 10
    eval_articles: int = 100
    eval_stride: int = 1
    eval_batch_size: int = 512
    device: str = "cpu"
    threads: int | None = None
    """Torch / OpenMP threads of every stage (None: the libraries' default)."""
    seed: int = 0


# ------------------------------------------------------------------------------------------------ the parent
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="training articles of each run (several sizes)")
    parser.add_argument("--articles", type=int, help="training articles (one size)")
    parser.add_argument("--out_dir", default="runs/scale_sim")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                        help="the stages to measure (the ones before them must be measured already)")
    parser.add_argument("--extrapolate", type=int, nargs="+", default=[PAPER_ARTICLES, WIKIPEDIA_ARTICLES])
    for knob in fields(Settings):
        kind = {"int | None": int, "float": float, "int": int, "str": str}[str(knob.type)]
        parser.add_argument(f"--{knob.name}", type=kind, default=None,
                            help=f"default {knob.default}" if knob.default is not None else "default: none")
    parser.add_argument("--child", choices=STAGES, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Measure every size and stage not yet measured, print the tables; the results (also in results.json)."""
    args = parse_args(argv)
    out = Path(args.out_dir)
    if args.child:
        run_child(args.child, args.articles, out)
        return {}
    sizes = sorted(set(args.sizes or ([args.articles] if args.articles else [])))
    if not sizes:
        raise SystemExit("scale_sim: give --sizes N [N ...] or --articles N")
    settings = _settings(out, args)
    print(f"scale_sim: {out} ({', '.join(f'{k} {v}' for k, v in asdict(settings).items())})", flush=True)
    for size in sizes:
        for stage in (s for s in STAGES if s in args.stages):
            measure(out, size, stage)
    results = summarise(out, sizes, args.extrapolate, settings)
    print(results["report"])
    (out / "report.md").write_text(results["report"] + "\n\n" + phases_report(results["records"]) + "\n")
    (out / "results.json").write_text(json.dumps({k: v for k, v in results.items() if k != "report"}, indent=1))
    return results


def _settings(out: Path, args: argparse.Namespace) -> Settings:
    """The settings of ``out``: those it was measured with, which an explicit flag may not contradict."""
    given = {k.name: getattr(args, k.name) for k in fields(Settings) if getattr(args, k.name) is not None}
    path = out / "settings.json"
    if path.is_file():
        kept = json.loads(path.read_text())
        clash = {k: (kept.get(k), v) for k, v in given.items() if kept.get(k) != v}
        if clash:
            raise SystemExit(f"scale_sim: {out} was measured with other settings ({clash}: kept, given); use another "
                             f"--out_dir")
        return Settings(**kept)
    settings = Settings(**given)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(settings), indent=1))
    return settings


def size_dir(out: Path, size: int) -> Path:
    return out / f"n{size}"


def record_path(out: Path, size: int, stage: str) -> Path:
    return size_dir(out, size) / "records" / f"{stage}.json"


def measure(out: Path, size: int, stage: str) -> dict:
    """Run one stage at one size in a child process (unless measured already) and record it."""
    path = record_path(out, size, stage)
    if path.is_file():
        record = json.loads(path.read_text())
        print(f"[{size:>9,} articles] {stage:<13} measured already: {_line(record)}", flush=True)
        return record
    earlier = STAGES[:STAGES.index(stage)]
    missing = [s for s in earlier if not record_path(out, size, s).is_file()]
    if missing:
        raise SystemExit(f"scale_sim: {stage} at {size} articles needs {missing} measured first (add them to --stages)")
    folder = size_dir(out, size) / FOLDERS[stage]
    attempts_path = path.with_name(f"{stage}.attempts.json")
    attempts = json.loads(attempts_path.read_text()) if attempts_path.is_file() and stage in RESUMABLE else []
    if not attempts:
        for later in STAGES[STAGES.index(stage):]:  # their inputs are made again: their numbers would be stale
            record_path(out, size, later).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)  # a measured stage starts from nothing (no resume, no reuse)
    (size_dir(out, size) / "records").mkdir(parents=True, exist_ok=True)
    log = size_dir(out, size) / "logs" / (f"{stage}.log" if not attempts else f"{stage}.{len(attempts)}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    env = child_env(out)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", stage, "--articles", str(size),
               "--out_dir", str(out)]
    print(f"[{size:>9,} articles] {stage:<13} running (log: {log}"
          + (f"; continuing after {len(attempts)} interrupted attempt(s) of {sum(a['wall_s'] for a in attempts):.0f} s)"
             if attempts else ")"), flush=True)
    attempts.append({"wall_s": 0.0, "cpu_s": 0.0, "peak_rss_mb": 0.0, "peak_anon_mb": 0.0})
    began = time.perf_counter()
    with open(log, "w") as log_file:
        child = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        done = threading.Event()
        watch = threading.Thread(target=_record_attempt, args=(child.pid, began, attempts, attempts_path, done),
                                 daemon=True)
        watch.start()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - began
    done.set()
    watch.join()
    if child.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise SystemExit(f"scale_sim: {stage} at {size} articles failed (exit {child.returncode}); its log ends:\n"
                         f"{tail}")
    inside = json.loads((size_dir(out, size) / "records" / f"{stage}.child.json").read_text())
    attempts[-1] = {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                    "peak_rss_mb": round(usage.ru_maxrss * 1024 / MB, 1),  # Linux: kilobytes
                    "peak_anon_mb": inside["peak_anon_mb"]}
    record = {"stage": stage, "articles": size, "wall_s": round(sum(a["wall_s"] for a in attempts), 2),
              "cpu_s": round(sum(a["cpu_s"] for a in attempts), 2),
              "peak_rss_mb": max(a["peak_rss_mb"] for a in attempts),
              "peak_anon_mb": max(a["peak_anon_mb"] for a in attempts), "peak_file_mb": inside["peak_file_mb"],
              "disk_mb": round(disk_bytes(folder) / MB, 2), "phases": inside["phases"], "counts": inside["counts"]}
    if len(attempts) > 1:
        record["attempts"] = attempts
    path.write_text(json.dumps(record, indent=1))
    attempts_path.unlink(missing_ok=True)
    print(f"[{size:>9,} articles] {stage:<13} done: {_line(record)}", flush=True)
    return record


def child_env(out: Path) -> dict[str, str]:
    """The environment of a stage's process: planlm from this checkout, offline, unbuffered, and the threads of
    ``out``'s settings."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    threads = json.loads((out / "settings.json").read_text()).get("threads")
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _record_attempt(pid: int, began: float, attempts: list[dict], path: Path, done: threading.Event,
                    every_s: float = 10.0) -> None:
    """While the stage's process ``pid`` runs, keep its attempt's wall and CPU seconds and peak memory so far in
    ``path`` (read from /proc), so that a measurement cut short (the machine taken away) can be continued: the stage
    resumes from its own records and the attempts' times add up."""
    ticks = os.sysconf("SC_CLK_TCK")
    while not done.is_set():
        try:
            fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return
        status = Probe.status(pid)
        if fields_[0] == "Z" or not status["VmHWM"]:  # finished: the parent's wait4 has the exact figures
            return
        attempt = attempts[-1]
        attempt["wall_s"] = round(time.perf_counter() - began, 2)
        attempt["cpu_s"] = round((int(fields_[11]) + int(fields_[12])) / ticks, 2)  # utime, stime
        attempt["peak_rss_mb"] = round(status["VmHWM"] / 1024, 1)
        attempt["peak_anon_mb"] = max(attempt["peak_anon_mb"], round(status["RssAnon"] / 1024, 1))
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(attempts, indent=1))
        os.replace(tmp, path)
        done.wait(every_s)


def _line(record: dict) -> str:
    return (f"{record['wall_s']:.1f} s ({record['cpu_s']:.1f} s CPU), peak RSS {record['peak_rss_mb']:,.0f} MB "
            f"(anonymous {record['peak_anon_mb']:,.0f} MB), disk {record['disk_mb']:,.1f} MB")


def disk_bytes(folder: Path) -> int:
    """Bytes the folder's files take on disk (allocated blocks)."""
    if not folder.exists():
        return 0
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


# ------------------------------------------------------------------------------------------------ the report
def summarise(out: Path, sizes: list[int], targets: list[int], settings: Settings) -> dict:
    """The records of every measured (size, stage), their growth and extrapolation, and the markdown report."""
    records = [json.loads(record_path(out, n, s).read_text()) for n in sizes for s in STAGES
               if record_path(out, n, s).is_file()]
    lines = ["| articles | stage | wall s | CPU s | wall s per 1k articles | peak RSS MB | peak anonymous MB "
             "| disk MB |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        stage = r["stage"] + (f" ({len(r['attempts'])} attempts, added up)" if r.get("attempts") else "")
        lines.append(f"| {r['articles']:,} | {stage} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{1000 * r['wall_s'] / r['articles']:.2f} | {r['peak_rss_mb']:,.0f} | {r['peak_anon_mb']:,.0f} | "
                     f"{r['disk_mb']:,.2f} |")
    growth, extrapolation = {}, {}
    shapes = [r["counts"]["splits"]["train"] for r in records if r["stage"] == "prepare" and "splits" in r["counts"]]
    if shapes:
        train = shapes[-1]
        lines += ["", f"Prepared training articles: {train['sentences'] / train['articles']:.1f} sentences and "
                  f"{train['tokens'] / train['articles']:,.0f} tokens each on average (the paper's Wikipedia: about 35 "
                  f"and 1,050)."]
    by = {(r["articles"], r["stage"]): r for r in records}
    pairs = two_largest(by)
    if pairs:
        lines += ["", "Growth of each stage between the two largest sizes it was measured at:", "",
                  "| stage | from | to | RSS ratio | anonymous ratio | anonymous MB per 1k articles | time ratio "
                  "| wall s per 1k articles | CPU s per 1k articles | disk MB per 1k articles |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for stage, (middle, largest) in pairs.items():
            low, high = by[(middle, stage)], by[(largest, stage)]
            per_k = {key: 1000 * (high[key] - low[key]) / (largest - middle)
                     for key in ("wall_s", "cpu_s", "peak_rss_mb", "peak_anon_mb", "disk_mb")}
            growth[stage] = {"from": middle, "to": largest, "rss_ratio": high["peak_rss_mb"] / low["peak_rss_mb"],
                             "anon_ratio": high["peak_anon_mb"] / max(low["peak_anon_mb"], 1e-9),
                             "time_ratio": high["wall_s"] / low["wall_s"], "per_1k_articles": per_k,
                             "s_per_article": high["wall_s"] / largest}
            lines.append(f"| {stage} | {middle:,} | {largest:,} | {growth[stage]['rss_ratio']:.2f} | "
                         f"{growth[stage]['anon_ratio']:.2f} | {per_k['peak_anon_mb']:.1f} | "
                         f"{growth[stage]['time_ratio']:.2f} | {per_k['wall_s']:.2f} | {per_k['cpu_s']:.2f} | "
                         f"{per_k['disk_mb']:.2f} |")
            extrapolation[stage] = {str(t): {key: linear(low[key], high[key], middle, largest, t)
                                             for key in ("wall_s", "peak_rss_mb", "peak_anon_mb", "disk_mb")}
                                    for t in targets}
        lines += ["", "Extrapolated linearly through those two sizes of each stage: time; RAM, the peak of the "
                  "anonymous memory (the peak RSS in brackets: it adds the pages of memory-mapped files, which the "
                  "kernel drops when memory runs short); disk:", "",
                  "| stage | " + " | ".join(f"{t:,} articles" for t in targets) + " |",
                  "|---|" + "---:|" * len(targets)]
        gb = lambda mb: f"{mb / 1024:,.1f} GB"
        for stage, at in extrapolation.items():
            lines.append(f"| {stage} | " + " | ".join(
                f"{hours(at[str(t)]['wall_s'])}, {gb(at[str(t)]['peak_anon_mb'])} RAM ({gb(at[str(t)]['peak_rss_mb'])}"
                f" RSS), {gb(at[str(t)]['disk_mb'])} disk" for t in targets) + " |")
        lines.append("| the stages above | " + " | ".join(
            f"{hours(sum(a[str(t)]['wall_s'] for a in extrapolation.values()))}, "
            f"{gb(max(a[str(t)]['peak_anon_mb'] for a in extrapolation.values()))} RAM at most, "
            f"{gb(sum(a[str(t)]['disk_mb'] for a in extrapolation.values()))} disk" for t in targets) + " |")
        lines += ["", f"Read with care: times are this machine's wall seconds; the trainings run a fixed number of "
                  f"steps ({settings.planner_steps} planner, {settings.lm_steps} LM), so their time extrapolates their "
                  f"data loading, not an epoch; evaluate reads {settings.eval_articles} test articles at every size; "
                  f"k-means fits at most {settings.fit_sample} sentences, so prepare's fit copy stops growing there; "
                  f"the networks are tiny and the sentence encoder a hashing stand-in, so model compute is not in "
                  f"these times. Below a few thousand articles the fixed costs dominate (imports, the networks' "
                  f"activations, k-means' buffers of 65,536 sentences, which fill up to about 1,900 articles): "
                  f"extrapolate from 3,000 articles and more."]
    return {"settings": asdict(settings), "records": records, "growth": growth, "extrapolation": extrapolation,
            "report": "\n".join(lines)}


def two_largest(measured) -> dict[str, list[int]]:
    """{stage: [the second largest, the largest size]} of each stage measured at two sizes or more, from the
    (size, stage) keys of ``measured``."""
    sizes = {stage: sorted(n for n, s in measured if s == stage) for stage in STAGES}
    return {stage: found[-2:] for stage, found in sizes.items() if len(found) >= 2}


def linear(low: float, high: float, low_n: int, high_n: int, n: int) -> float:
    """The value at ``n`` on the line through (low_n, low) and (high_n, high), never below ``high`` (a noisy decrease
    is no decrease)."""
    slope = max((high - low) / (high_n - low_n), 0.0)
    return high + slope * (n - high_n)


def hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def phases_report(records: list[dict]) -> str:
    """Each stage's phases at each size (seconds, memory after the phase, the peak so far) and, with two sizes or more,
    the anonymous memory each phase leaves behind per 1,000 more articles (what a phase keeps grows with the corpus)."""
    lines = ["Phases (the product functions a stage spends its time in; memory after each, and the peak RSS so far):",
             "",
             "| articles | stage | phase | s | RSS after MB | anonymous after MB | peak RSS so far MB |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for r in records:
        for p in r["phases"]:
            lines.append(f"| {r['articles']:,} | {r['stage']} | {p['phase']} | {p['s']:.2f} | {p['rss_mb']:,.0f} | "
                         f"{p['anon_mb']:,.0f} | {p['peak_rss_mb']:,.0f} |")
    by = {(r["articles"], r["stage"]): r["phases"] for r in records}
    pairs = two_largest(by)
    if not pairs:
        return "\n".join(lines)
    lines += ["", "What each phase adds, per 1,000 articles more between the two largest sizes its stage was measured "
              "at: the anonymous memory after it, less the same before it, and its seconds:", "",
              "| stage | from | to | phase | anonymous MB kept per 1k articles | s per 1k articles |",
              "|---|---:|---:|---|---:|---:|"]
    for stage, (middle, largest) in pairs.items():
        low, high = by[(middle, stage)], by[(largest, stage)]
        if [p["phase"] for p in low] != [p["phase"] for p in high]:
            continue
        for i, (a, b) in enumerate(zip(low, high)):
            if a["phase"] == "(end)":
                continue
            kept = lambda ps: ps[i]["anon_mb"] - (ps[i - 1]["anon_mb"] if i else 0.0)
            per_k = 1000 / (largest - middle)
            lines.append(f"| {stage} | {middle:,} | {largest:,} | {a['phase']} | "
                         f"{(kept(high) - kept(low)) * per_k:+.1f} | {(b['s'] - a['s']) * per_k:+.2f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the child
class Probe:
    """In a stage's process: the peak of its anonymous and file-backed resident memory (sampled) and its phases."""

    def __init__(self, interval: float = 0.1):
        self.phases: list[dict] = []
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(interval,), daemon=True)
        self._thread.start()

    @staticmethod
    def status(pid: int | str = "self") -> dict[str, int]:
        """VmRSS, VmHWM (the peak RSS), RssAnon, RssFile of process ``pid`` (default: this one) in kB (zeros where
        /proc is missing)."""
        found = {"VmRSS": 0, "VmHWM": 0, "RssAnon": 0, "RssFile": 0}
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    if name in found:
                        found[name] = int(value.split()[0])
        except OSError:
            pass
        return found

    def _poll(self, interval: float) -> None:
        while not self._stop.is_set():
            now = self.status()
            for name in self.peak:
                self.peak[name] = max(self.peak[name], now[name])
            self._stop.wait(interval)

    def mark(self, phase: str, seconds: float) -> None:
        import resource

        now = self.status()
        for name in self.peak:
            self.peak[name] = max(self.peak[name], now[name])
        self.phases.append({"phase": phase, "s": round(seconds, 3), "rss_mb": round(now["VmRSS"] / 1024, 1),
                            "anon_mb": round(now["RssAnon"] / 1024, 1),
                            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})

    def wrap(self, module, name: str, label_arg: int | None = None) -> None:
        """Time every call of ``module.name`` as a phase (labelled with its positional argument ``label_arg``: a split's
        name, or a split)."""
        inner = getattr(module, name)

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                label = name
                if label_arg is not None and len(args) > label_arg:
                    label += f"[{getattr(args[label_arg], 'name', args[label_arg])}]"
                self.mark(label, time.perf_counter() - began)

        setattr(module, name, timed)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_child(stage: str, size: int, out: Path) -> None:
    settings = Settings(**json.loads((out / "settings.json").read_text()))
    probe = Probe()
    began = time.perf_counter()
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    paths = {s: size_dir(out, size) / folder for s, folder in FOLDERS.items()}
    counts = CHILDREN[stage](settings, size, paths, probe)
    probe.mark("(end)", time.perf_counter() - began)
    probe.stop()
    record = {"phases": probe.phases, "counts": counts, "peak_anon_mb": round(probe.peak["RssAnon"] / 1024, 1),
              "peak_file_mb": round(probe.peak["RssFile"] / 1024, 1)}
    (size_dir(out, size) / "records" / f"{stage}.child.json").write_text(json.dumps(record, indent=1))


def _imported(probe: Probe, began: float) -> None:
    probe.mark("imports", time.perf_counter() - began)


def _watch_manifest(probe: Probe) -> None:
    import planlm.stage.folder

    probe.wrap(planlm.stage.folder, "write_manifest")  # the manifest hashes every file the stage wrote


def child_corpus(settings: Settings, size: int, paths: dict, probe: Probe) -> dict:
    from scale_sim_data import write_corpus

    wanted = math.ceil((size + 2 * settings.heldout) * 1.05) + 20  # a margin for the articles prepare skips
    began = time.perf_counter()
    counts = write_corpus(paths["corpus"] / "corpus.jsonl", wanted, settings.seed, settings.mean_sentences)
    probe.mark("write_corpus", time.perf_counter() - began)
    return counts


def child_prepare(settings: Settings, size: int, paths: dict, probe: Probe) -> dict:
    began = time.perf_counter()
    import planlm.data.prepare as prepare_module
    from planlm.data.corpus import CorpusConfig
    from planlm.data.embed import EmbedConfig
    from planlm.data.kmeans import ActionsConfig
    from planlm.data.prepare import prepare
    from planlm.stage import read_manifest
    from scale_sim_data import install_hashing_encoder

    install_hashing_encoder(settings.embedding_dim)
    _imported(probe, began)
    for name, label_arg in (("draw_articles", None), ("_embed_split", 1), ("fit_codebook", None),
                            ("_write_split", 1), ("_save_codebook_and_hash", None)):
        probe.wrap(prepare_module, name, label_arg)
    _watch_manifest(probe)
    prepare(out_dir=str(paths["prepare"]),
            corpus=CorpusConfig(source=str(paths["corpus"] / "corpus.jsonl"), num_train=size,
                                num_validation=settings.heldout, num_test=settings.heldout, piece_sentences=None,
                                seed=settings.seed),
            embedding=EmbedConfig(encoder=f"scale-sim-hashing-{settings.embedding_dim}", batch_size=256,
                                  device="cpu"),
            actions=ActionsConfig(num_actions=settings.num_actions, fit_sample=settings.fit_sample,
                                  seed=settings.seed),
            tokenizer=settings.tokenizer)
    manifest = read_manifest(paths["prepare"])
    return {"splits": manifest["counts"], "skipped": manifest["skipped"]}


def child_train_planner(settings: Settings, size: int, paths: dict, probe: Probe) -> dict:
    began = time.perf_counter()
    import planlm.train.planner as planner_module
    from planlm.args import Runtime
    from planlm.models.planner import PlannerSettings
    from planlm.train.planner import PlannerTrainArgs, train_planner

    _imported(probe, began)
    for name, label_arg in (("_checked_splits", None), ("_loader", 0), ("fit", None), ("_final_metrics", None)):
        probe.wrap(planner_module, name, label_arg)
    _watch_manifest(probe)
    out = train_planner(str(paths["prepare"]), str(paths["train-planner"]),
                        PlannerSettings(d_model=settings.planner_width, num_heads=2, num_layers=1,
                                     dim_feedforward=2 * settings.planner_width, horizon=settings.horizon,
                                     dynamics=settings.planner_dynamics),
                        PlannerTrainArgs(batch_size=settings.planner_batch_size, max_epochs=1,
                                         limit_train_batches=settings.planner_steps, loggers=["csv"],
                                         seed=settings.seed),
                        Runtime(device=settings.device))
    summary = json.loads((out / "summary.json").read_text())
    return {"global_step": summary["global_step"], "boundaries_evaluated": summary["num_boundaries"]}


def child_sample_plans(settings: Settings, size: int, paths: dict, probe: Probe) -> dict:
    began = time.perf_counter()
    import planlm.plans.sampling as sampling_module
    from planlm.args import Runtime
    from planlm.plans.config import PlanConfig
    from planlm.plans.sampling import sample_plans
    from planlm.stage import read_manifest

    _imported(probe, began)
    probe.wrap(sampling_module, "_sample_split", 1)
    _watch_manifest(probe)
    sample_plans(str(paths["prepare"]), PlanConfig(planner_dir=str(paths["train-planner"]), num_paths=settings.num_paths,
                                                   horizon=settings.horizon, seed=settings.seed),
                 out_dir=str(paths["sample-plans"]), batch_size=256, runtime=Runtime(device=settings.device))
    return {"boundaries": read_manifest(paths["sample-plans"])["counts"]}


def child_train_lm(settings: Settings, size: int, paths: dict, probe: Probe) -> dict:
    began = time.perf_counter()
    import planlm.train.lm as lm_module
    from planlm.args import Runtime
    from planlm.models.adapter import AdapterSettings
    from planlm.plans.config import PlanConfig
    from planlm.stage import read_manifest
    from planlm.train.lm import TINY_GPT2, LMModelConfig, LMTrainConfig, train_lm

    _imported(probe, began)
    for name in ("_check_tokenizer", "_build_model", "_loaders", "_train"):
        probe.wrap(lm_module, name)
    _watch_manifest(probe)
    train_lm(str(paths["prepare"]), str(paths["train-lm"]), LMModelConfig(model_config=dict(TINY_GPT2)),
             PlanConfig(kind="planner_sampled", num_paths=settings.num_paths, horizon=settings.horizon,
                        plans_dir=str(paths["sample-plans"])),
             AdapterSettings(kind="multipath", num_heads=2),
             LMTrainConfig(batch_size=settings.lm_batch_size, max_epochs=1, limit_train_batches=settings.lm_steps,
                           loggers=["csv"], seed=settings.seed),
             Runtime(device=settings.device))
    return {"global_step": read_manifest(paths["train-lm"])["global_step"]}


def child_evaluate(settings: Settings, size: int, paths: dict, probe: Probe) -> dict:
    began = time.perf_counter()
    import planlm.evaluate.perplexity as perplexity_module
    from planlm.args import Runtime
    from planlm.evaluate.perplexity import evaluate
    from planlm.plans.config import PlanConfig

    _imported(probe, began)
    for name in ("load_checked", "plan_source", "plan_vector_table", "scoring_windows", "target_cells",
                 "score_windows", "_write_evaluation"):
        probe.wrap(perplexity_module, name)
    _watch_manifest(probe)
    metrics = evaluate(str(paths["train-lm"]), str(paths["prepare"]), str(paths["evaluate"]), split="test",
                       plans=PlanConfig(plans_dir=str(paths["sample-plans"])), stride=settings.eval_stride,
                       max_articles=settings.eval_articles, batch_size=settings.eval_batch_size,
                       runtime=Runtime(device=settings.device))
    return {"articles": metrics.articles, "tokens": metrics.tokens, "windows": metrics.windows, "ppl": metrics.ppl}


CHILDREN = {"corpus": child_corpus, "prepare": child_prepare, "train-planner": child_train_planner,
            "sample-plans": child_sample_plans, "train-lm": child_train_lm, "evaluate": child_evaluate}


if __name__ == "__main__":
    main()
