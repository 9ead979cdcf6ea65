"""`planlm verify`: every finished stage folder of a run checked against the record its manifest holds
(``planlm.stage.integrity``), as a table of intact / damaged."""

from __future__ import annotations

import json
from pathlib import Path

from planlm.errors import PlanlmError
from planlm.stage.integrity import FORMAT_KEY, FORMAT_VERSION, MANIFEST, DamagedArtifact, check_files, load_json


def verify_run(run_dir: str | Path, full: bool = True) -> list[tuple[Path, int, str]]:
    """(stage folder, files recorded, "intact" | what is damaged | "other format: ...") of every stage folder under
    ``run_dir``, and of every stage that its run_state.json records as done but that has no manifest any more."""
    rows = [(stage_dir, 0, f"damaged: {MANIFEST} missing (the stage is rebuilt)")
            for stage_dir in _done_without_manifest(Path(run_dir))]
    rows += [(cache, 0, f"incomplete: no {MANIFEST} (resampled when next used)")
             for plans in Path(run_dir).rglob("plans") if plans.is_dir()
             for cache in sorted(plans.iterdir()) if cache.is_dir() and not (cache / MANIFEST).is_file()]
    for manifest_path in sorted(Path(run_dir).rglob(MANIFEST)):
        stage_dir = manifest_path.parent
        try:
            manifest = load_json(manifest_path, fix="")
        except DamagedArtifact:
            manifest = None
        if not isinstance(manifest, dict):
            rows.append((stage_dir, 0, f"damaged: {MANIFEST} is not a readable manifest (not a JSON object)"))
            continue
        if manifest.get(FORMAT_KEY, 1) != FORMAT_VERSION:  # format 1: written before manifests held one
            rows.append((stage_dir, 0, f"other format: written in format {manifest.get(FORMAT_KEY, 1)}, this planlm "
                                       f"reads format {FORMAT_VERSION} (delete it and rerun)"))
            continue
        files = manifest.get("files") or {}
        damage = check_files(stage_dir, manifest, full=full)
        status = "intact" if not damage else "damaged: " + "; ".join(
            f"{d.path.relative_to(stage_dir)}: {d.what}" for d in damage)
        rows.append((stage_dir, len(files), status))
    return rows


def _done_without_manifest(run_dir: Path) -> list[Path]:
    try:
        stages = json.loads((run_dir / "run_state.json").read_text()).get("stages", {})
    except (OSError, ValueError, AttributeError):
        return []
    folders = {Path(info["out_dir"]) for info in stages.values()
               if isinstance(info, dict) and info.get("status") == "done" and info.get("out_dir")}
    return sorted(folder for folder in folders if not (folder / MANIFEST).is_file())


class DamagedRun(PlanlmError):
    """`planlm verify` found damaged stage folders."""

    exit_status = 1


def verify(run_dir: str, quick: bool = False) -> None:
    """Check the files of every finished stage folder of a run against its manifest: a table of intact / damaged.

    Each file's size, header and content hash (sha256) are compared with those recorded when it was written.

    Exits with status 1 when a stage is damaged (`planlm run` rebuilds it; the table names each file) or was written
    in another planlm's format (delete it and rerun), 2 when ``run_dir`` holds no stage folder.

    Args:
        run_dir: A `planlm run` folder (every stage under it is checked) or one stage folder.
        quick: Run only the cheap check that every reader runs on reuse (sizes, headers, the smallest files'
            hashes) instead of every content hash.
    """
    from rich.console import Console
    from rich.table import Table

    root = Path(run_dir)
    rows = verify_run(root, full=not quick)
    if not rows:
        raise PlanlmError(f"{root}: no stage folder here (no manifest.json under it); give a `planlm run` folder")
    table = Table("stage folder", "files", "status", title=f"planlm verify {root} ({'cheap' if quick else 'full'} check)")
    for stage_dir, count, status in rows:
        color = "green" if status == "intact" else "red"
        table.add_row(_shown(stage_dir, root), str(count), f"[{color}]{status}[/]")
    Console(highlight=False, width=200).print(table)
    old = [str(stage_dir) for stage_dir, _, status in rows if status.startswith("other format")]
    if old:
        raise DamagedRun(f"{len(old)} of {len(rows)} stage folders were written by another planlm's format "
                         f"({', '.join(old)}); delete them and rerun the `planlm run` that made them")
    damaged = [str(stage_dir) for stage_dir, _, status in rows if status.startswith(("damaged", "incomplete"))]
    if damaged:
        raise DamagedRun(f"{len(damaged)} of {len(rows)} stage folders damaged or incomplete ({', '.join(damaged)}); rerun the "
                         f"`planlm run` that made them (it rebuilds damaged stages and reuses the rest)")
    print(f"planlm verify: {len(rows)} stage folders intact")


def _shown(stage_dir: Path, root: Path) -> str:
    try:
        return str(stage_dir.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(stage_dir)
