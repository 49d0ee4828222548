"""Where things are in a run folder: every file and folder name, in one place.

    RUN_DIR/run.json                          RunInfo (runfolder.info)
    RUN_DIR/scenario.yaml                     a copy of the scenario file
    RUN_DIR/reference.json                    the built-in workload's fault-free loss of every
                                              rank at every step (harness.job.reference;
                                              reports.trajectory holds the trials against it)
    RUN_DIR/trials/<policy>/trial.json        TrialInfo, with the trial's plan (runfolder.plan)
    RUN_DIR/trials/<policy>/events.jsonl      one JSON event per line (runfolder.events)
    RUN_DIR/trials/<policy>/logs/rNNN.log     each rank's stdout and stderr
    RUN_DIR/trials/<policy>/logs/torchrun/rNNN/   a torchrun agent's own log folder
    RUN_DIR/trials/<policy>/ckpt/             the ranks' atomic checkpoints
    RUN_DIR/trials/<policy>/stacks/           every live process's Python stacks at the hang cap
                                              (index.json, and one py-spy JSON per process:
                                              harness.trial.stacks; reports.stuck reads them)
    RUN_DIR/trials/<policy>/flight/rNNN.json  a rank's flight recorder at the hang cap: the
                                              collectives it entered (harness.job.flight)
    RUN_DIR/trials/<policy>/heartbeat_gaps.json   the gaps between every rank's heartbeats at
                                              the control plane (runfolder.heartbeats; a policy
                                              with a failure detector only)
    RUN_DIR/metrics.csv, report.md, report.html, plots/timeline-<policy>.png
                                              written by `reports` (or into `--out DIR`)
    OUT/compare.md                            `chaos report RUN_DIR... --out OUT`, several runs
    CAMPAIGN_DIR/campaign.json                `chaos campaign`: the mix, the schedule, each job's
                                              run folder (docs/campaign.md)
"""
from __future__ import annotations

from pathlib import Path

# a campaign's folder (harness.studies.campaign): its record, one run folder per job of each policy
CAMPAIGN_FILE = "campaign.json"
CAMPAIGN_FORMAT = 1  # of campaign.json: its readers refuse another
RUN_FILE = "run.json"
SCENARIO_FILE = "scenario.yaml"
REFERENCE_FILE = "reference.json"
REFERENCE_LOG = "reference.log"  # what computing it printed
TRIALS_DIR = "trials"
TRIAL_FILE = "trial.json"  # beside it: runfolder.events.EVENTS_FILE
LOGS_DIR = "logs"
TORCHRUN_LOGS_DIR = "torchrun"  # under LOGS_DIR
CHECKPOINT_DIR = "ckpt"
STACKS_DIR = "stacks"
STACKS_INDEX = "index.json"  # in every stacks folder
STACKS_AT_DETECT = "detect-{index}"  # in STACKS_DIR: at fault `index`'s first detection
FLIGHT_DIR = "flight"        # harness.job.flight writes rNNN.json there
METRICS_FILE = "metrics.csv"
REPORT_MARKDOWN = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"
COMPARE_FILE = "compare.md"


def trial_dir(run_dir: Path, trial: str) -> Path:
    return Path(run_dir) / TRIALS_DIR / trial


def trial_dirs(run_dir: Path) -> list[Path]:
    """The trial folders of a run, by name (reports order them as run.json lists them). A
    trial began when its trial.json was written: a folder without one (the harness killed
    between the two) is a trial that never began, not a broken run."""
    trials = Path(run_dir) / TRIALS_DIR
    return sorted(p for p in trials.iterdir() if (p / TRIAL_FILE).is_file()) if trials.is_dir() else []


def stacks_dir(trial_dir: Path, detect_of: int | None = None) -> Path:
    """Where a trial's stacks are: at the hang cap (stacks/), or at the first detection of
    fault `detect_of` (stacks/detect-<index>/)."""
    folder = Path(trial_dir) / STACKS_DIR
    return folder if detect_of is None else folder / STACKS_AT_DETECT.format(index=detect_of)


def rank_log(trial_dir: Path, rank: int) -> Path:
    """What rank `rank`'s process (under torchrun: its agent and workers) printed; the
    backends name it after the rank's host (chaos.topology.host_name)."""
    return Path(trial_dir) / LOGS_DIR / f"r{rank:03d}.log"


def flight_file(trial_dir: Path, rank: int) -> Path:
    """Where rank `rank` dumps its flight recorder (harness.job.flight)."""
    return Path(trial_dir) / FLIGHT_DIR / f"r{rank:03d}.json"


COMPARISON_PLOT = f"{PLOTS_DIR}/comparison.png"  # the policies compared, relative to the reports' folder


def plot_file(trial: str) -> str:
    """The timeline plot of a trial, relative to the reports' folder."""
    return f"{PLOTS_DIR}/timeline-{trial}.png"
