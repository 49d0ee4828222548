"""The fake event histories the reports tests read (report_fakes.py) hold to the run-folder
schema real events are written by (runfolder.events.SCHEMA): a fake that drifted from real
events would test the reports on histories no trial writes."""
from __future__ import annotations

import inspect

import pytest

from runfolder.events import schema_problems
from tests.reports import report_fakes

HISTORIES = [f for name, f in inspect.getmembers(report_fakes, inspect.isfunction)
             if f.__module__ == report_fakes.__name__ and inspect.signature(f).return_annotation == "tuple[Events, TrialInfo]"
             and all(p.default is not p.empty for p in inspect.signature(f).parameters.values())]


def test_every_history_is_found():
    assert {f.__name__ for f in HISTORIES} >= {"absorbed", "failed_fast", "recovered", "isolated", "hung", "crashed",
                                               "rejoined", "restarted", "elastic_hosts", "no_fault"}


@pytest.mark.parametrize("history", HISTORIES, ids=lambda f: f.__name__)
def test_a_fake_history_is_made_of_events_the_schema_allows(history):
    events, _ = history()
    problems = sorted({problem for event in events for problem in schema_problems(event)})
    assert problems == []
