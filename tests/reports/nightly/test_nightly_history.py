"""The history database: rows, metadata, one transaction, idempotent re-append, schema version."""
from __future__ import annotations

import math
import sqlite3
from dataclasses import replace

import pandas as pd
import pytest

from reports.nightly import History, HistoryError, NightConflict, NightInfo, append_night, read_history
from reports.nightly.history import SCHEMA_VERSION, reproduce_command, trial_rows

from .nightly_fakes import COMMAND, info, night, trial


def two_repeats() -> list[list[dict]]:
    return [[trial(policy="timeout", outcome="failed-fast", seed=1, ttd_s=5.2, wasted_rank_s=40.0),
             trial(policy="baseline", outcome="hung", seed=1, hung_cap=30.0, wasted_rank_s=480.0)],
            [trial(policy="timeout", outcome="failed-fast", seed=2, ttd_s=5.3, wasted_rank_s=41.0,
                   expect='{"outcome": "failed-fast"}', expect_failures=""),
             trial(policy="baseline", outcome="hung", seed=None, hung_cap=30.0, wasted_rank_s=479.0)]]


def test_one_row_per_trial_and_per_measured_metric():
    history = night(0, two_repeats())
    assert list(history.trials[["policy", "repeat", "seed"]].itertuples(index=False, name=None)) == [
        ("timeout", 0, 1), ("baseline", 0, 1), ("timeout", 1, 2), ("baseline", 1, pd.NA)]
    assert history.trials["command"].unique().tolist() == [COMMAND]
    # a metric that did not apply (NaN in analyze_run) has no row: the hung baseline has no ttd_s
    rows = history.metrics[history.metrics["policy"] == "baseline"]
    assert sorted(rows["metric"]) == ["wasted_rank_s", "wasted_rank_s"]
    assert history.metrics[history.metrics["metric"] == "ttd_s"]["value"].tolist() == [5.2, 5.3]


def test_round_trip_keeps_every_row_type_and_the_metadata(tmp_path):
    db = tmp_path / "history.sqlite"
    written = night(0, two_repeats())
    assert append_night(db, written) is True
    back = read_history(db)
    for (_, mine), (_, theirs) in zip(written.frames(), back.frames(), strict=True):
        pd.testing.assert_frame_equal(mine, theirs)
    assert back.info("2025-01-01") == info(0)
    assert math.isnan(back.trials["hung_cap"].iloc[0]) and back.trials["hung_cap"].iloc[1] == 30.0
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_nights_are_read_in_start_order_and_trials_in_run_order(tmp_path):
    db = tmp_path / "history.sqlite"
    for index in (2, 0, 1):
        append_night(db, night(index, two_repeats()))
    history = read_history(db)
    assert history.night_ids == ("2025-01-01", "2025-01-02", "2025-01-03")
    assert history.nights_before("2025-01-03", 1) == ("2025-01-02",)
    assert history.nights_before("2025-01-01", 7) == ()
    assert list(history.trials["night"].unique()) == list(history.night_ids)
    assert list(history.trials["policy"][:4]) == ["timeout", "baseline", "timeout", "baseline"]


def test_appending_the_same_night_again_changes_nothing(tmp_path):
    db = tmp_path / "history.sqlite"
    append_night(db, night(0, two_repeats()))
    assert append_night(db, night(0, two_repeats())) is False
    assert len(read_history(db).trials) == 4


def test_appending_other_figures_under_the_same_night_is_refused(tmp_path):
    db = tmp_path / "history.sqlite"
    append_night(db, night(0, two_repeats()))
    other = two_repeats()
    other[0][0]["ttd_s"] = 9.9
    with pytest.raises(NightConflict, match=r"history.sqlite: night 2025-01-01 is already stored with other "
                                            r"figures; give this night another id"):
        append_night(db, night(0, other))
    assert 9.9 not in read_history(db).metrics["value"].tolist()


def test_a_night_lands_whole_or_not_at_all(tmp_path):
    db = tmp_path / "history.sqlite"
    good = night(0, two_repeats())
    # the same metric row twice: the metrics insert fails after nights and trials were copied
    broken = History(nights=good.nights, trials=good.trials,
                     metrics=pd.concat([good.metrics, good.metrics.iloc[:1]], ignore_index=True))
    with pytest.raises(sqlite3.IntegrityError):
        append_night(db, broken)
    history = read_history(db)
    assert (len(history.nights), len(history.trials), len(history.metrics)) == (0, 0, 0)
    assert append_night(db, good) is True


def test_a_repeat_given_twice_is_refused():
    with pytest.raises(ValueError, match="loss_20pct / timeout repeat 0 appears in two runs"):
        night(0, [[trial(policy="timeout", outcome="failed-fast"), trial(policy="timeout", outcome="failed-fast")]])


def test_night_info_needs_an_id_and_an_iso_start():
    with pytest.raises(ValueError, match="NightInfo.started: 'last night' is not an ISO 8601 time"):
        NightInfo(night="n", started="last night")
    with pytest.raises(ValueError, match="NightInfo.night: empty"):
        replace(info(0), night="")


def test_a_database_of_another_schema_version_is_refused(tmp_path):
    db = tmp_path / "history.sqlite"
    append_night(db, night(0, two_repeats()))
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA user_version = 5")
    message = "history schema version 5, this chaos-harness reads versions 1, 2, 3 and 4; give --history a new file"
    with pytest.raises(HistoryError, match=message):
        read_history(db)
    with pytest.raises(HistoryError, match=message):
        append_night(db, night(1, two_repeats()))


@pytest.mark.parametrize("version, lacks", [(1, ("loop_ns", "wake_us", "fault_us")), (2, ("fault_us",)), (3, ())])
def test_an_older_file_is_read_as_it_is_and_upgraded_by_the_next_append(tmp_path, version, lacks):
    db = tmp_path / "history.sqlite"
    append_night(db, night(0, two_repeats(), loop_ns=70.0, wake_us=9.0, fault_us=1.5))
    with sqlite3.connect(db) as con:  # the nights without the figures that version lacks
        for column in lacks:
            con.execute(f"ALTER TABLE nights DROP COLUMN {column}")
        for column in ("state", "state_detail"):  # every version before 4
            con.execute(f"ALTER TABLE trials DROP COLUMN {column}")
        con.execute(f"PRAGMA user_version = {version}")
    old = read_history(db)
    measured = {"loop_ns": 70.0, "wake_us": 9.0, "fault_us": 1.5}
    assert old.info("2025-01-01") == replace(info(0), **(measured | dict.fromkeys(lacks)))
    assert append_night(db, night(1, two_repeats(), loop_ns=140.0, wake_us=20.0, fault_us=3.0))
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    upgraded = read_history(db)
    assert upgraded.night_ids == ("2025-01-01", "2025-01-02")
    assert all(getattr(upgraded.info("2025-01-01"), column) is None for column in lacks)
    tonight = upgraded.info("2025-01-02")
    assert (tonight.loop_ns, tonight.wake_us, tonight.fault_us) == (140.0, 20.0, 3.0)
    assert len(upgraded.trials) == 2 * len(old.trials)
    assert list(upgraded.trials["state"]) == [""] * len(old.trials) + ["consistent"] * len(old.trials)


def test_files_that_are_not_history_databases_are_refused(tmp_path):
    with pytest.raises(HistoryError, match="no such history database"):
        read_history(tmp_path / "missing.sqlite")
    text = tmp_path / "notes.txt"
    text.write_text("not a database, just long enough to have a header page of its own " * 10)
    with pytest.raises(HistoryError, match="notes.txt: cannot be used as an SQLite database"):
        append_night(text, night(0, two_repeats()))
    with pytest.raises(HistoryError, match="notes.txt: not an SQLite database"):
        read_history(text)
    with pytest.raises(HistoryError, match="give --history a new file in a folder that exists"):
        append_night(tmp_path / "no-such-folder" / "history.sqlite", night(0, two_repeats()))
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE mine (x)")
    with pytest.raises(HistoryError, match="schema version 0"):
        append_night(other, night(0, two_repeats()))


def test_trial_rows_put_the_metrics_beside_each_trial():
    rows = trial_rows(night(0, two_repeats()), "2025-01-01")
    assert rows[["policy", "repeat", "ttd_s"]].fillna(-1).values.tolist() == [
        ["timeout", 0, 5.2], ["baseline", 0, -1], ["timeout", 1, 5.3], ["baseline", 1, -1]]
    assert rows["wasted_rank_s"].tolist() == [40.0, 480.0, 41.0, 479.0]
    assert math.isnan(rows["breaker_open_s"].iloc[0])


@pytest.mark.parametrize("stored, expected", [
    ("chaos run s.yaml --backend docker --policy a --policy b --seed 1",
     "chaos run s.yaml --backend docker --policy retry --seed 7"),
    ("chaos run s.yaml --seed=3 --policy=a --ranks 4", "chaos run s.yaml --ranks 4 --policy retry --seed 7"),
    ("chaos run 'my scenarios/s.yaml'", "chaos run 'my scenarios/s.yaml' --policy retry --seed 7"),
])
def test_reproduce_command_pins_policy_and_seed(stored, expected):
    assert reproduce_command({"command": stored, "policy": "retry", "seed": 7}) == expected


def test_reproduce_command_without_a_seed_keeps_the_scenarios():
    assert reproduce_command({"command": "chaos run s.yaml", "policy": "retry", "seed": pd.NA}) == \
        "chaos run s.yaml --policy retry"
