"""A torchrun-like worker for stub_probe.py: says whether it started warm, then exits or waits."""
import json
import sys
import time

warm = "torch._dynamo" in sys.modules  # a fresh interpreter has not imported it yet
if sys.argv[1] == "exit":
    sys.exit(3)
with open(sys.argv[2], "w") as f:
    json.dump({"pid": __import__("os").getpid(), "warm": warm}, f)
time.sleep(60)
