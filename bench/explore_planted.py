"""Does `chaos explore` find a planted defect (issue 55, part 3; docs/explore.md, "Planted
defects")? Runs it on one of tests/run/planted/'s scenarios, then the schedule it wrote
(found-01.yaml) again with `chaos run`, and says what it found, when, how far it shrank and
how often the written scenario fails the same way.

    sudo .venv/bin/python bench/explore_planted.py DEFECT [--budget 5m] [--seed N]
        [--reproduce 5] [--control 2] [--out FILE.json] [-- EXPLORE OPTIONS...]

DEFECT: restore_while_saving, retries_never_reset or save_in_place (the scenario of that
name). Options after `--` go to `chaos explore` as they are (--kinds, --max-faults,
--weights, --repeats). Time to find is the seconds of the trials up to the first that
broke its contract (bring-up included, `tried.jsonl`); the reproduction counts runs whose
trial the oracle judges broken with the found outcome (its expect: block names the signature); the control (--control N) runs the
same schedule with the policy's planted_defect taken out, which should keep the contract. Writes the figures, the machine
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

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PLANTED = REPO / "tests" / "run" / "planted"
CHAOS = [sys.executable, "-m", "harness.cli"]


def _judged(run_dir: Path) -> list[tuple[str, str, str]]:
    """Each trial of one run: its outcome, the oracle's verdict and signature (a found file's
    `expect:` block is its oracle: the signature then names the expectation it failed)."""
    import reports
    from reports.oracle import judge
    from runfolder.info import read_trial_info
    from runfolder.layout import trial_dir
    judged = []
    for _, row in reports.analyze_run(run_dir).iterrows():
        verdict = judge(row, read_trial_info(trial_dir(run_dir, row["trial"])).plan)
        judged.append((row["outcome"], verdict.verdict, verdict.signature))
    return judged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("defect", choices=sorted(p.stem for p in PLANTED.glob("*.yaml") if "." not in p.stem))
    parser.add_argument("--budget", default="5m")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reproduce", type=int, default=5, help="runs of the written scenario")
    parser.add_argument("--control", type=int, default=0, help="runs of the found schedule with the policy's "
                                                               "planted_defect taken out (it should pass)")
    parser.add_argument("--out", help="write the figures here as JSON")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.explore = argv[cut + 1:]  # after --: more `chaos explore` options
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
                     "schedules": len({t["schedule"].split("-s")[0] for t in tried if not t["schedule"].startswith("found-")}),
                     "runs": len(tried)}  # the found files' own reruns (found-NN) included
    broken = [i for i, t in enumerate(tried) if t["verdict"] == "broken"]
    found = sorted(folder.glob("found-*.yaml"))
    if not broken or not found:
        figures["found"] = None
        print(json.dumps(figures, indent=1))
        _write(args.out, figures)
        return 1
    first = tried[broken[0]]
    header = found[0].read_text()
    again = shlex.split(next(line.split("# run it again: ", 1)[1] for line in header.splitlines()
                             if line.startswith("# run it again: ")))
    figures.update({
        "found": first["signature"], "found_in_schedule": first["schedule"],
        "seconds_to_find": round(sum(t["seconds"] for t in tried[:broken[0] + 1]), 1),
        "drawn_faults": first["faults"], "shrunk_faults": yaml.safe_load(header)["faults"],
        "shrinking": next(line[2:] for line in header.splitlines() if line.startswith("# schedule ")),
        "shrink_runs": sum("-s" in t["schedule"] for t in tried), "reproduce_command": shlex.join(again)})
    failed, outcomes = _reproduce(again, work / "again", env, first["outcome"], args.reproduce)
    figures.update({"reproduced": failed, "reproduce_runs": args.reproduce, "reproduce_signatures": outcomes})
    # the control: the same schedule under the same policy without its planted defect
    data = yaml.safe_load(header)
    planted = {name: spec.pop("planted_defect") for name, spec in (data.get("policies") or {}).items()
               if "planted_defect" in spec}
    if planted and args.control:
        control = work / "control.yaml"
        control.write_text(yaml.safe_dump(data, sort_keys=False))
        failed, outcomes = _reproduce([again[0], again[1], str(control), *again[3:]], work / "control", env,
                                      first["outcome"], args.control)
        figures.update({"control_failed": failed, "control_runs": args.control, "control_signatures": outcomes})
    figures["folder"] = str(work)
    print(json.dumps(figures, indent=1))
    _write(args.out, figures)
    return 0


def _reproduce(command: list[str], out: Path, env: dict[str, str], outcome: str,
               runs: int) -> tuple[int, list[list[tuple[str, str, str]]]]:
    """Run `command` (a `chaos run` line) `runs` times: how many broke the contract with the
    found `outcome`, and each run's (outcome, verdict, signature) per trial."""
    failed, outcomes = 0, []
    for attempt in range(runs):
        folder = out / str(attempt)
        subprocess.run([*CHAOS, *command[1:], "--quiet", "--out", str(folder)], env=env, capture_output=True,
                       text=True)
        [run_dir] = [p for p in folder.iterdir() if p.is_dir()]
        outcomes.append(_judged(run_dir))
        failed += any(o == outcome and verdict == "broken" for o, verdict, _ in outcomes[-1])
    return failed, outcomes


def _write(out: str | None, figures: dict) -> None:
    if out:
        Path(out).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
