"""``prepare`` killed with SIGKILL in the middle of embedding and again in the middle of tokenising, at a size the scale
simulation has measured: what each rerun finds to resume from, what it redoes, and whether the folder it finishes is
bit-identical to the simulation's uninterrupted one.

It reruns ``prepare`` on the simulation's corpus of that size (``benchmarks/scale_sim.py``: same settings, same stand-in
encoder) into ``<out_dir>/n<N>/resume/prepared``, three times:

1. killed (SIGKILL, from inside the process, so the point is exact) when the training split's embedding file is
   ``--embedding_at`` of the way through its chunks: after a chunk's rows are written and before the record that
   counts them, so the rerun must redo that chunk;
2. rerun, and killed when ``--tokens_at`` of the training articles are tokenised: after a batch's tokens reach the spool
   files and before the record that counts them, so the rerun must drop them;
3. rerun to the end.

Each attempt runs in a child process of its own (wall time, CPU time and peak RSS measured as the simulation does), and
logs the first progress record it writes for the training split's embeddings and tokens: a rerun that resumes writes
the one after the last record the killed attempt left, not the first. The finished folder is then compared file by file
with ``<out_dir>/n<N>/prepared`` (sha256 of every file; the manifest without its creation time and wall time).

    python benchmarks/scale_resume.py --out_dir runs/scale_sim --articles 100000

Writes ``<out_dir>/n<N>/resume/report.md`` and ``results.json``; the report's table goes to docs/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (HERE, ROOT):  # scale_sim beside it; planlm from this checkout, installed or not
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import scale_sim  # noqa: E402  (benchmarks/ is not a package)

KILLS = ("embedding", "tokens", None)
# Manifest fields that say when and how fast the folder was made, not what it holds.
CIRCUMSTANTIAL = ("created", "wall_time_s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", required=True, help="a scale simulation's folder (benchmarks/scale_sim.py)")
    parser.add_argument("--articles", type=int, required=True, help="a size whose prepare it has measured")
    parser.add_argument("--embedding_at", type=float, default=0.5,
                        help="the share of the training embedding's chunks done when the first attempt is killed")
    parser.add_argument("--tokens_at", type=float, default=0.5,
                        help="the share of the training articles tokenised when the second attempt is killed")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # the attempt to run in this process
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.out_dir)
    size = args.articles
    folder = scale_sim.size_dir(out, size) / "resume"
    if args.child is not None:
        run_attempt(args, out, size, folder)
        return {}
    for share, flag in ((args.embedding_at, "--embedding_at"), (args.tokens_at, "--tokens_at")):
        if not 0 < share < 1:
            raise SystemExit(f"scale_resume: {flag} must lie strictly between 0 and 1 (got {share})")
    reference = scale_sim.record_path(out, size, "prepare")
    if not reference.is_file():
        raise SystemExit(f"scale_resume: {out} has no measured prepare at {size} articles; run "
                         f"benchmarks/scale_sim.py --out_dir {out} --sizes {size} --stages corpus prepare first")
    uninterrupted = json.loads(reference.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "logs").mkdir(parents=True)
    attempts = []
    for number, kill in enumerate(KILLS):
        attempts.append(run_parent(args, out, size, folder, number, kill))
    differing = compare(scale_sim.size_dir(out, size) / "prepared", folder / "prepared")
    results = {"articles": size, "uninterrupted": {k: uninterrupted[k] for k in ("wall_s", "cpu_s", "peak_rss_mb")},
               "attempts": attempts, "differing_files": differing,
               "files_compared": sum(1 for p in (folder / "prepared").rglob("*") if p.is_file())}
    results["report"] = report(results)
    (folder / "results.json").write_text(json.dumps({k: v for k, v in results.items() if k != "report"}, indent=1))
    (folder / "report.md").write_text(results["report"] + "\n")
    print(results["report"])
    return results


def run_parent(args: argparse.Namespace, out: Path, size: int, folder: Path, number: int, kill: str | None) -> dict:
    """One attempt in a child process: how it ended, its time and memory, and the progress it found and wrote."""
    log = folder / "logs" / f"attempt{number}.log"
    env = scale_sim.child_env(out)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(number), "--out_dir", str(out),
               "--articles", str(size), "--embedding_at", str(args.embedding_at), "--tokens_at", str(args.tokens_at)]
    found = progress_state(folder / "prepared")
    print(f"[{size:>9,} articles] prepare attempt {number} ({'killed in ' + kill if kill else 'to the end'}; "
          f"log: {log})", flush=True)
    began = time.perf_counter()
    with open(log, "w") as log_file:
        child = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    code = os.waitstatus_to_exitcode(status)
    expected = -signal.SIGKILL if kill else 0
    if code != expected:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise SystemExit(f"scale_resume: attempt {number} exited with {code}, not {expected}; its log ends:\n{tail}")
    written = json.loads((folder / f"attempt{number}.json").read_text())
    record = {"attempt": number, "killed_in": kill, "exit": code, "wall_s": round(wall, 2),
              "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
              "found": found, "first_written": written["first"], "last_written": written["last"],
              "targets": written["targets"], "phases": written["phases"]}
    print(f"[{size:>9,} articles] prepare attempt {number}: exit {code} after {wall:.1f} s; found {found}, wrote "
          f"{written['first']} first", flush=True)
    return record


def progress_state(prepared: Path) -> dict:
    """The training split's progress records that a rerun can resume from (chunks embedded, articles tokenised)."""
    from planlm.jsonio import read_record

    embedded = read_record(prepared / "train" / "embeddings.npy.progress.json")
    tokens = read_record(prepared / "train" / "tokens.progress.json")
    return {"embedding_chunks": embedded.get("done"), "token_articles": tokens.get("articles")}


def compare(reference: Path, candidate: Path) -> list[str]:
    """The files that differ between two prepared folders (or lie in one only): sha256 of each file, the manifest
    without its circumstantial fields."""
    from planlm.files import file_sha256
    from planlm.jsonio import fingerprint

    def digests(root: Path) -> dict[str, str]:
        found = {}
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            name = str(path.relative_to(root))
            if name == "manifest.json":
                found[name] = fingerprint({k: v for k, v in json.loads(path.read_text()).items()
                                           if k not in CIRCUMSTANTIAL})
            else:
                found[name] = file_sha256(path)
        return found

    a, b = digests(reference), digests(candidate)
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))


def run_attempt(args: argparse.Namespace, out: Path, size: int, folder: Path) -> None:
    """In the child: prepare into ``folder/prepared``, logging the training split's progress records as they are
    written, and killing this process at the attempt's point."""
    import planlm.data.artifacts
    import planlm.data.embed

    kill = KILLS[args.child]
    settings = scale_sim.Settings(**json.loads((out / "settings.json").read_text()))
    state = {"first": {}, "last": {}, "targets": {}, "phases": []}
    state_path = folder / f"attempt{args.child}.json"

    def save() -> None:
        state_path.write_text(json.dumps(state, indent=1))

    def watch(module, file_name: str, what: str, count_key: str, target_of) -> None:
        inner = module.write_json

        def write_json(path, record, *rest, **kwargs):
            path = Path(path)
            if path.parent.name == "train" and path.name == file_name and record.get(count_key):
                count = int(record[count_key])
                state["first"].setdefault(what, count)
                target = target_of(record)
                state["targets"][what] = target
                if kill == what and count >= target:
                    save()
                    os.kill(os.getpid(), signal.SIGKILL)  # the work is on disk, its record is not
                state["last"][what] = count
                save()
            return inner(path, record, *rest, **kwargs)

        module.write_json = write_json

    chunks = lambda record: max(1, math.ceil(args.embedding_at * math.ceil(
        record["num_sentences"] / planlm.data.embed.CHUNK_SIZE)))
    watch(planlm.data.embed, "embeddings.npy.progress.json", "embedding", "done", chunks)
    watch(planlm.data.artifacts, "tokens.progress.json", "tokens", "articles",
          lambda record: max(1, math.ceil(args.tokens_at * size)))

    probe = scale_sim.Probe()
    mark = probe.mark

    def marked(phase: str, seconds: float) -> None:
        mark(phase, seconds)
        state["phases"] = probe.phases
        save()

    probe.mark = marked
    save()
    paths = {stage: scale_sim.size_dir(out, size) / name for stage, name in scale_sim.FOLDERS.items()}
    paths["prepare"] = folder / "prepared"
    scale_sim.child_prepare(settings, size, paths, probe)
    probe.stop()
    save()


def report(results: dict) -> str:
    size, base = results["articles"], results["uninterrupted"]
    lines = [f"`prepare` at {size:,} articles, killed twice and rerun (`benchmarks/scale_resume.py`):", "",
             "| attempt | ended | wall s | CPU s | peak RSS MB | found on start: chunks embedded / articles tokenised "
             "| first record it wrote: chunks / articles |", "|---|---|---:|---:|---:|---|---|"]
    for a in results["attempts"]:
        ended = f"killed in {a['killed_in']} (SIGKILL)" if a["killed_in"] else "finished"
        found = f"{_count(a['found']['embedding_chunks'])} / {_count(a['found']['token_articles'])}"
        first = f"{_count(a['first_written'].get('embedding'))} / {_count(a['first_written'].get('tokens'))}"
        lines.append(f"| {a['attempt'] + 1} | {ended} | {a['wall_s']:.1f} | {a['cpu_s']:.1f} | {a['peak_rss_mb']:,.0f} "
                     f"| {found} | {first} |")
    total = sum(a["wall_s"] for a in results["attempts"])
    lines.append(f"| uninterrupted (the simulation's) | finished | {base['wall_s']:.1f} | {base['cpu_s']:.1f} | "
                 f"{base['peak_rss_mb']:,.0f} | | |")
    lines += ["", f"The three attempts took {total:.1f} s against {base['wall_s']:.1f} s uninterrupted "
              f"({total - base['wall_s']:+.1f} s)."]
    differing = results["differing_files"]
    lines.append(f"The finished folder against the uninterrupted one: {results['files_compared']} files compared, "
                 + ("all bit-identical." if not differing else f"{len(differing)} differ: {', '.join(differing)}."))
    lines += ["", "Phases of each attempt (seconds; a killed attempt lists the ones it finished):", "",
              "| attempt | phases |", "|---|---|"]
    for a in results["attempts"]:
        phases = ", ".join(f"{p['phase']} {p['s']:.1f}" for p in a["phases"])
        lines.append(f"| {a['attempt'] + 1} | {phases} |")
    return "\n".join(lines)


def _count(value) -> str:
    return "-" if value is None else f"{value:,}"


if __name__ == "__main__":
    main()
