"""Does `chaos explore` find a planted defect (issue 55, part 3; docs/explore.md, "Planted
defects")? Runs it on one of tests/run/planted/'s scenarios, then the schedule it wrote
(found-01.yaml) again with `chaos run`, and says what it found, when, how far it shrank and
how often the written scenario fails the same way.

    sudo .venv/bin/python bench/explore_planted.py DEFECT [--budget 5m] [--seed N]
        [--reproduce 5] [--out FILE.json] [-- EXPLORE OPTIONS...]

DEFECT: restore_while_saving, retries_never_reset or save_in_place (the scenario of that
name). Options after `--` go to `chaos explore` as they are (--kinds, --max-faults,
--weights, --repeats). Time to find is the seconds of the trials up to the first that
broke its contract (bring-up included, `tried.jsonl`); the reproduction counts runs whose
trial the oracle judges broken with the found signature. Writes the figures, the machine
and both commands as JSON (--out).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PLANTED = REPO / "tests" / "run" / "planted"
CHAOS = [sys.executable, "-m", "harness.cli"]


def _signatures(run_dir: Path) -> list[str]:
    import reports
    from reports.oracle import judge
    from runfolder.info import read_trial_info
    from runfolder.layout import trial_dir
    return [judge(row, read_trial_info(trial_dir(run_dir, row["trial"])).plan).signature
            for _, row in reports.analyze_run(run_dir).iterrows()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("defect", choices=sorted(p.stem for p in PLANTED.glob("*.yaml") if "." not in p.stem))
    parser.add_argument("--budget", default="5m")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reproduce", type=int, default=5, help="runs of the written scenario")
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("explore", nargs="*", help="after --: more `chaos explore` options")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    work = Path(tempfile.mkdtemp(prefix=f"explore-planted-{args.defect}-"))
    explore = [*CHAOS, "explore", str(PLANTED / f"{args.defect}.yaml"), "--seed", str(args.seed),
               "--budget", args.budget, "--quiet", "--out", str(work / "explore"), *args.explore]
    began = time.monotonic()
    done = subprocess.run(explore, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
    [folder] = (work / "explore").glob("explore-*")
    tried = [json.loads(line) for line in (folder / "tried.jsonl").read_text().splitlines()]
    figures: dict = {"defect": args.defect, "command": shlex.join(["chaos", *explore[3:]]),
                     "date": datetime.date.today().isoformat(), "machine": f"{os.cpu_count()} CPUs, {platform.node()}",
                     "explore_exit": done.returncode, "explore_wall_s": round(wall, 1),
                     "schedules": len({t["schedule"].split("-s")[0] for t in tried}), "runs": len(tried)}
    broken = [i for i, t in enumerate(tried) if t["verdict"] == "broken"]
    found = sorted(folder.glob("found-*.yaml"))
    if not broken or not found:
        figures["found"] = None
        print(json.dumps(figures, indent=1))
        _write(args.out, figures)
        return 1
    first = tried[broken[0]]
    header = found[0].read_text()
    import yaml
    again = shlex.split(next(line.split("# run it again: ", 1)[1] for line in header.splitlines()
                             if line.startswith("# run it again: ")))
    figures.update({
        "found": first["signature"], "found_in_schedule": first["schedule"],
        "seconds_to_find": round(sum(t["seconds"] for t in tried[:broken[0] + 1]), 1),
        "drawn_faults": first["faults"], "shrunk_faults": yaml.safe_load(header)["faults"],
        "shrinking": next(line[2:] for line in header.splitlines() if line.startswith("# schedule ")),
        "shrink_runs": sum("-s" in t["schedule"] for t in tried), "reproduce_command": shlex.join(again)})
    failed, outcomes = 0, []
    for attempt in range(args.reproduce):
        out = work / f"again-{attempt}"
        subprocess.run([*CHAOS, *again[1:], "--quiet", "--out", str(out)], env=env, capture_output=True, text=True)
        [run_dir] = [p for p in out.iterdir() if p.is_dir()]
        signatures = _signatures(run_dir)
        outcomes.append(signatures)
        failed += first["signature"] in signatures
    figures.update({"reproduced": failed, "reproduce_runs": args.reproduce, "reproduce_signatures": outcomes,
                    "folder": str(work)})
    print(json.dumps(figures, indent=1))
    _write(args.out, figures)
    return 0


def _write(out: str | None, figures: dict) -> None:
    if out:
        Path(out).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
