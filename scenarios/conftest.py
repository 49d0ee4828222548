"""Every scenario file here is a test per policy: see harness/pytest_plugin.py."""
from harness.pytest_plugin import (  # noqa: F401  (pytest finds hooks and fixtures by name)
    chaos_check, chaos_out, pytest_addoption, pytest_collect_file, pytest_collection_modifyitems,
    pytest_configure, pytest_terminal_summary)
