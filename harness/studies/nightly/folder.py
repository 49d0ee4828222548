"""The night folder: its manifest (the plan's digest, the night's metadata, each finished
cell; rewritten atomically after every cell) and the resume of an unfinished night."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from chaos.errors import UsageError

MANIFEST = "manifest.json"
RUNS = "runs"


@dataclass(frozen=True)
class Done:
    key: str
    repeat: int
    run: str          # the run folder (a campaign's: its campaign folder), relative to the night folder
    trials: int
    seconds: float
    kind: str = "run"  # or "campaign" (plan.CampaignCell); a manifest from before campaigns has none


@dataclass(frozen=True)
class Manifest:
    night: str
    digest: str
    plan_file: str
    info: dict[str, Any]          # reports.nightly.NightInfo's fields, gathered once
    done: tuple[Done, ...] = ()
    finished: bool = False

    def keys(self) -> set[str]:
        return {d.key for d in self.done}


def write_manifest(night_dir: Path, manifest: Manifest) -> None:
    """Atomically: a crash leaves the old manifest or the new one, never half of one."""
    path = night_dir / MANIFEST
    scratch = path.with_suffix(".tmp")
    with open(scratch, "w") as file:
        json.dump(dataclasses.asdict(manifest), file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.replace(scratch, path)


def read_manifest(night_dir: Path) -> Manifest:
    path = night_dir / MANIFEST
    try:
        data = json.loads(path.read_text())
        return Manifest(**{**data, "done": tuple(Done(**d) for d in data["done"])})
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{path}: not a night manifest ({exc}); give --out another folder "
                         "or --night another id") from None


def open_night(out: Path, digest: str, plan_file: Path, night: str | None,
               gather: Callable[[str, str], dict[str, Any]], now: datetime.datetime) -> tuple[Path, Manifest]:
    """The night folder to run in: `night` if given (resumed when it exists), else the newest
    unfinished night of the same plan under `out`, else a new one named after `now`.
    `gather(night, started)` gives a new night's metadata."""
    if night is None:
        unfinished = [m for m in (read_manifest(p.parent) for p in sorted(out.glob(f"*/{MANIFEST}")))
                      if not m.finished and m.digest == digest]
        unfinished.sort(key=lambda m: m.info["started"])
        night = unfinished[-1].night if unfinished else now.strftime("%Y-%m-%dT%H%M%SZ")
    night_dir = out.resolve() / night  # absolute, as the run folders made in it are
    if (night_dir / MANIFEST).exists():
        manifest = read_manifest(night_dir)
        if manifest.digest != digest:
            raise UsageError(f"{night_dir}: night {night} ran another plan ({manifest.plan_file}); "
                             "give --night a new id to start a night of this plan")
        _remove_half_made(night_dir, manifest)
        return night_dir, manifest
    (night_dir / RUNS).mkdir(parents=True, exist_ok=True)
    manifest = Manifest(night=night, digest=digest, plan_file=str(plan_file),
                        info=gather(night, now.isoformat(timespec="seconds")))
    write_manifest(night_dir, manifest)
    return night_dir, manifest


def _remove_half_made(night_dir: Path, manifest: Manifest) -> None:
    """An interrupted cell's run folder: not in the manifest, so never analyzed; it goes."""
    kept = {night_dir / d.run for d in manifest.done}
    for run_dir in (night_dir / RUNS).iterdir():
        if run_dir not in kept:
            shutil.rmtree(run_dir)
