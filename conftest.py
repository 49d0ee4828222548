"""Every test session of this repository, tests/ and scenarios/ alike, ends with the host
check (tests/session.py): registered here, above both folders, so that it starts before
the scenario plugin's session launcher and ends after it."""
from tests.session import host_left_clean  # noqa: F401  (a fixture: pytest finds it by its name)
