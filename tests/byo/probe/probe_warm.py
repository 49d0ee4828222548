"""Imported first by start_probe.py: a preloaded start has torch._dynamo before the script
imports anything; a fresh interpreter has not."""
import sys

WARM = "torch._dynamo" in sys.modules
