"""History of nights in an embedded SQLite database, written and read with pandas.

A night is what one `chaos nightly` ran: every repeat of every scenario x policy of its plan,
each repeat a run folder that `reports.analyze_run` turns into one row per trial. Tables
(schema version SCHEMA_VERSION, kept in SQLite's user_version):

  nights   one row per night: night (its id), started (ISO 8601 wall time; nights are read
           in this order), the run metadata of NightInfo (with the machine's speed as the
           night began, harness.trial.machine: NULL where not measured), and digest (sha256
           of the night's rows, so that appending the same night again can be recognised)
  trials   one row per night, scenario, policy (or variant) and repeat: what analyze_run says
           of the trial (outcome, seed, expectations, ...) and the run's stored command
  metrics  one row per night, scenario, policy, repeat and metric of NIGHTLY_METRICS: value.
           A metric that does not apply to a trial (NaN in analyze_run) has no row.

A night is appended in one transaction: pandas writes its rows into an in-memory staging
database (pandas commits after each table it writes), then one SQLite transaction copies
them into the history file. Appending a night already stored is idempotent when its rows
are the same (same digest: a resumed runner may append twice) and refused otherwise.

Columns were added over versions (the nights' machine speed, a page's first touch, the
trials' state verdict: "" for trials stored before it, read as not observed); an older file
is read as it is (the figures it lacks unknown) and given their columns by its next append.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import math
import shlex
import sqlite3
from contextlib import closing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

SCHEMA_VERSION = 4
_ADD = {name: f'ALTER TABLE nights ADD COLUMN "{name}" REAL' for name in ("loop_ns", "wake_us", "fault_us")}
_ADD.update({name: f"ALTER TABLE trials ADD COLUMN \"{name}\" TEXT NOT NULL DEFAULT ''"
             for name in ("state", "state_detail")})
_STATE = (_ADD["state"], _ADD["state_detail"])
UPGRADABLE = {1: (_ADD["loop_ns"], _ADD["wake_us"], _ADD["fault_us"], *_STATE), 2: (_ADD["fault_us"], *_STATE),
              3: _STATE}
LOCK_TIMEOUT_S = 30.0  # how long an append waits for another writer of the same file
LOWER, HIGHER = "lower", "higher"


@dataclass(frozen=True)
class Metric:
    """A figure kept per trial in the history, compared by the gate and plotted in the trends."""

    column: str        # its column in reports.analyze_run's rows
    label: str
    unit: str
    better: str        # LOWER or HIGHER
    resolution: float  # the smallest change that counts, in `unit`: the gate's floor
    gauge: str         # its Prometheus gauge


STEP_S = 0.25  # the demo job's step period: a shift shorter than one step is not a finding
MIB = 2.0 ** 20
NIGHTLY_METRICS: tuple[Metric, ...] = (
    Metric("ttd_s", "time to detect, first rank", "s", LOWER, STEP_S, "chaos_nightly_ttd_seconds"),
    Metric("ttd_max_s", "time to detect, last rank", "s", LOWER, STEP_S, "chaos_nightly_ttd_last_rank_seconds"),
    Metric("ttr_s", "time to recover from fault start", "s", LOWER, STEP_S, "chaos_nightly_ttr_seconds"),
    Metric("ttr_after_end_s", "time to recover from fault end", "s", LOWER, STEP_S,
           "chaos_nightly_ttr_after_heal_seconds"),
    Metric("breaker_open_s", "breaker open", "s", LOWER, STEP_S, "chaos_nightly_breaker_open_seconds"),
    Metric("released_s", "resources released, processes gone", "s", LOWER, STEP_S,
           "chaos_nightly_released_seconds"),
    Metric("excluded_s", "rank left out by the survivors", "s", LOWER, STEP_S, "chaos_nightly_excluded_seconds"),
    Metric("wasted_rank_s", "wasted rank-seconds", "rank-s", LOWER, 1.0, "chaos_nightly_wasted_rank_seconds"),
    Metric("max_stall_s", "longest stall of a rank", "s", LOWER, STEP_S, "chaos_nightly_max_stall_seconds"),
    Metric("steps_per_s_after", "steps/s after recovery", "steps/s", HIGHER, 0.1,
           "chaos_nightly_steps_per_second_after"),
    Metric("suspect_events", "failure-detector suspicions", "events", LOWER, 1.0, "chaos_nightly_suspect_events"),
    Metric("cuda_reserved_after", "accelerator memory reserved after release", "bytes", LOWER, 64 * MIB,
           "chaos_nightly_accelerator_reserved_after_bytes"),
    # a campaign cell's (reports.nightly.campaign): time on kept steps / wall time, in percent
    Metric("ettr_pct", "effective training time ratio (campaign)", "%", HIGHER, 2.0, "chaos_nightly_ettr_percent"),
)


class HistoryError(ValueError):
    """A history database that cannot be used; the message is one line for the user."""


class NightConflict(HistoryError):
    """A night of the same id is stored with other rows."""


@dataclass(frozen=True)
class NightInfo:
    """A night's id and the run metadata stored with it ("" where it does not apply or is unknown)."""

    night: str
    started: str  # ISO 8601 wall time
    commit: str = ""
    host: str = ""
    kernel: str = ""
    torch: str = ""
    cuda: str = ""
    gpu: str = ""
    driver: str = ""
    nccl: str = ""
    backend: str = ""
    # harness.trial.machine's figures as the night began: None where not measured
    loop_ns: float | None = None
    wake_us: float | None = None
    fault_us: float | None = None

    def __post_init__(self) -> None:
        if not self.night:
            raise ValueError("NightInfo.night: empty; give the night an id such as its date")
        try:
            datetime.datetime.fromisoformat(self.started)
        except ValueError:
            raise ValueError(f"NightInfo.started: {self.started!r} is not an ISO 8601 time "
                             "(e.g. 2025-01-08T02:00:00+00:00)") from None

    @property
    def started_at(self) -> datetime.datetime:
        return datetime.datetime.fromisoformat(self.started)

    def machine_text(self) -> str:
        """The machine's speed in words, "" where it was not measured."""
        return ", ".join(f"{what} {value:.3g} {unit}" for name, (what, unit) in MACHINE_FIGURES.items()
                         if (value := getattr(self, name)) is not None)


@dataclass(frozen=True, eq=False)
class NightRun:
    """One run folder of a night: its reports.analyze_run rows, which repeat it was, and
    the command stored with it (run.json's command)."""

    repeat: int
    command: str
    trials: pd.DataFrame


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]  # (column, SQLite type and constraint)
    key: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def quoted(self) -> str:
        return ", ".join(f'"{name}"' for name in self.names)  # `commit` is an SQL keyword

    def ddl(self) -> str:
        columns = ", ".join(f'"{name}" {kind}' for name, kind in self.columns)
        return f"CREATE TABLE {self.name} ({columns}, PRIMARY KEY ({', '.join(self.key)}))"


TEXT, INTEGER, REAL = "TEXT NOT NULL", "INTEGER", "REAL"
NIGHT_FIELDS = tuple(f.name for f in fields(NightInfo))
# NightInfo's machine figures (harness.trial.machine): what each measures, its unit
MACHINE_FIGURES = {"loop_ns": ("a Python loop step", "ns"),
                   "wake_us": ("a round trip between two processes on one CPU", "us"),
                   "fault_us": ("a page's first touch", "us")}
MACHINE_FIELDS = tuple(MACHINE_FIGURES)
NIGHTS = Table("nights", (*((name, REAL if name in MACHINE_FIELDS else TEXT) for name in NIGHT_FIELDS),
                          ("digest", TEXT)), ("night",))
TRIAL_KEY = ("night", "scenario", "policy", "repeat")
# analyze_run's columns kept per trial
FROM_ANALYSIS = ("policy_base", "fault", "seed", "outcome", "outcome_reason", "hung_cap", "timeout_s",
                 "expect", "expect_failures", "run", "state", "state_detail")
TRIALS = Table("trials", (("night", TEXT), ("scenario", TEXT), ("policy", TEXT), ("repeat", "INTEGER NOT NULL"),
                          ("policy_base", TEXT), ("fault", TEXT), ("seed", INTEGER), ("outcome", TEXT),
                          ("outcome_reason", TEXT), ("hung_cap", REAL), ("timeout_s", REAL), ("expect", TEXT),
                          ("expect_failures", TEXT), ("run", TEXT), ("command", TEXT), ("state", TEXT),
                          ("state_detail", TEXT)), TRIAL_KEY)
METRICS = Table("metrics", (("night", TEXT), ("scenario", TEXT), ("policy", TEXT), ("repeat", "INTEGER NOT NULL"),
                            ("metric", TEXT), ("value", "REAL NOT NULL")), (*TRIAL_KEY, "metric"))
TABLES = (NIGHTS, TRIALS, METRICS)


def _typed(frame: pd.DataFrame, table: Table) -> pd.DataFrame:
    """The table's columns in order with one dtype per SQLite type, however the rows came."""
    out = {}
    for name, kind in table.columns:
        column = frame[name] if name in frame else pd.Series(index=frame.index, dtype=object)
        if kind.startswith("TEXT"):
            out[name] = column.astype(object).where(column.notna(), "").astype(str)
        else:
            numbers = pd.to_numeric(column, errors="coerce")
            out[name] = numbers.astype("Int64") if kind.startswith("INTEGER") else numbers.astype(float)
    return pd.DataFrame(out, index=frame.index).reset_index(drop=True)


@dataclass(frozen=True, eq=False)
class History:
    """Nights in start order, their trials and metrics in the order they were run."""

    nights: pd.DataFrame
    trials: pd.DataFrame
    metrics: pd.DataFrame

    @property
    def night_ids(self) -> tuple[str, ...]:
        return tuple(self.nights["night"])

    def info(self, night: str) -> NightInfo:
        rows = self.nights[self.nights["night"] == night]
        if not len(rows):
            raise KeyError(f"night {night!r} is not in the history")
        return NightInfo(**{name: _known(rows.iloc[0][name]) for name in NIGHT_FIELDS})

    def nights_before(self, night: str, count: int) -> tuple[str, ...]:
        """The `count` nights that started before `night`, oldest first (fewer in a short history)."""
        order = self.night_ids
        if night not in order:
            raise KeyError(f"night {night!r} is not in the history")
        at = order.index(night)
        return order[max(0, at - count):at]

    def frames(self) -> tuple[tuple[Table, pd.DataFrame], ...]:
        return (NIGHTS, self.nights), (TRIALS, self.trials), (METRICS, self.metrics)


def _known(value: Any) -> Any:
    """A stored value, None where SQLite held NULL (NaN once in a float column)."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _digest(info: NightInfo, trials: pd.DataFrame, metrics: pd.DataFrame) -> str:
    digest = hashlib.sha256(json.dumps(asdict(info), sort_keys=True).encode())
    for frame in (trials, metrics):
        digest.update(frame.to_csv(index=False).encode())
    return digest.hexdigest()


def night_history(info: NightInfo, runs: Iterable[NightRun]) -> History:
    """One night as a History (the shape read_history returns), from its runs' analyze_run rows."""
    trial_dicts: list[dict[str, Any]] = []
    metric_dicts: list[dict[str, Any]] = []
    for run in runs:
        for _, row in run.trials.iterrows():
            key = {"night": info.night, "scenario": row["scenario"], "policy": row["policy"], "repeat": run.repeat}
            trial_dicts.append({**key, **{column: row.get(column) for column in FROM_ANALYSIS},
                               "command": run.command})
            metric_dicts += [{**key, "metric": metric.column, "value": value} for metric in NIGHTLY_METRICS
                            if not math.isnan(value := _number(row.get(metric.column)))]
    trials = _typed(pd.DataFrame(trial_dicts, columns=list(TRIALS.names)), TRIALS)
    twice = trials[trials.duplicated(list(TRIAL_KEY), keep=False)]
    if len(twice):
        first = twice.iloc[0]
        raise ValueError(f"night {info.night}: {first['scenario']} / {first['policy']} repeat {first['repeat']} "
                         "appears in two runs; give each run of a scenario its own repeat number")
    metrics = _typed(pd.DataFrame(metric_dicts, columns=list(METRICS.names)), METRICS)
    nights = _typed(pd.DataFrame([{**asdict(info), "digest": _digest(info, trials, metrics)}]), NIGHTS)
    return History(nights=nights, trials=trials, metrics=metrics)


def _check_schema(con: sqlite3.Connection, path: Path) -> int:
    """The file's schema version: this one or one it upgrades."""
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{path}: not an SQLite database ({exc}); give --history a new file") from None
    if version != SCHEMA_VERSION and version not in UPGRADABLE:
        raise HistoryError(f"{path}: history schema version {version}, this chaos-harness reads versions "
                           f"{', '.join(map(str, sorted(UPGRADABLE)))} and {SCHEMA_VERSION}; "
                           "give --history a new file")
    return version


def _create_or_check(path: Path) -> None:
    """Give an empty or new database file the schema; check the version of any other, and
    bring an older one up to this version."""
    try:
        with closing(sqlite3.connect(path, isolation_level=None, timeout=LOCK_TIMEOUT_S)) as con:
            con.execute("BEGIN IMMEDIATE")  # closing without COMMIT rolls back
            if not con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                for table in TABLES:
                    con.execute(table.ddl())
                con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            if (version := _check_schema(con, path)) != SCHEMA_VERSION:
                for statement in UPGRADABLE[version]:
                    con.execute(statement)
                con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            con.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{path}: cannot be used as an SQLite database ({exc}); "
                           "give --history a new file in a folder that exists") from None


def append_night(path: Path, night: History) -> bool:
    """Append one night to the history database at `path` (created when missing) in one
    transaction. True when appended; False when that night was already stored with the same
    rows. Raises NightConflict when it was stored with other rows, HistoryError when `path`
    is not a history database of this schema version."""
    path = Path(path)
    ids = night.night_ids
    if len(ids) != 1:
        raise ValueError(f"append_night takes one night; got {len(ids)}")
    digest = str(night.nights["digest"].iloc[0])
    _create_or_check(path)
    with closing(sqlite3.connect(":memory:", isolation_level=None, timeout=LOCK_TIMEOUT_S)) as con:
        for table, frame in night.frames():
            frame.to_sql(table.name, con, index=False)
        con.execute("ATTACH DATABASE ? AS history", (str(path),))
        con.execute("BEGIN IMMEDIATE")
        try:
            stored = con.execute("SELECT digest FROM history.nights WHERE night = ?", (ids[0],)).fetchone()
            if stored is None:
                for table in TABLES:
                    con.execute(f"INSERT INTO history.{table.name} ({table.quoted()}) "
                                f"SELECT {table.quoted()} FROM main.{table.name} ORDER BY rowid")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    if stored is None:
        return True
    if stored[0] == digest:
        return False
    raise NightConflict(f"{path}: night {ids[0]} is already stored with other figures; "
                        "give this night another id, or append it to another --history file")


def _select(table: Table, con: sqlite3.Connection) -> str:
    """The table's columns that the file has (an older version lacks some: _typed adds them)."""
    stored = {row[1] for row in con.execute(f"PRAGMA table_info({table.name})")}
    columns = ", ".join(f't."{name}"' for name in table.names if name in stored)
    if table is NIGHTS:
        return f"SELECT {columns} FROM nights AS t ORDER BY t.started, t.night"
    return (f"SELECT {columns} FROM {table.name} AS t JOIN nights AS n ON n.night = t.night "
            "ORDER BY n.started, n.night, t.rowid")


def read_history(path: Path) -> History:
    """Every night stored in the history database at `path`."""
    path = Path(path)
    if not path.is_file():
        raise HistoryError(f"{path}: no such history database (chaos nightly --history {path} writes one)")
    with closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=LOCK_TIMEOUT_S)) as con:
        _check_schema(con, path)
        frames = {table.name: _typed(pd.read_sql_query(_select(table, con), con), table) for table in TABLES}
    return History(**frames)


def trial_rows(history: History, night: str) -> pd.DataFrame:
    """One row per trial of a night, in run order: its trials columns and one column per
    metric of NIGHTLY_METRICS (NaN where the metric did not apply)."""
    trials = history.trials[history.trials["night"] == night]
    metrics = history.metrics[history.metrics["night"] == night]
    wide = metrics.set_index([*TRIAL_KEY, "metric"])["value"].unstack("metric")
    rows = trials.join(wide, on=list(TRIAL_KEY)).reset_index(drop=True)
    for metric in NIGHTLY_METRICS:
        if metric.column not in rows:
            rows[metric.column] = math.nan
    return rows


def reproduce_command(trial: Mapping[str, Any]) -> str:
    """The trial's stored command narrowed to its policy and pinned to its seed."""
    words, kept = shlex.split(str(trial["command"])), []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in ("--policy", "--seed"):
            skip = True
        elif not word.startswith(("--policy=", "--seed=")):
            kept.append(word)
    seed = trial.get("seed")
    pinned = [] if seed is None or seed is pd.NA else ["--seed", str(int(seed))]
    return shlex.join([*kept, "--policy", str(trial["policy"]), *pinned])
