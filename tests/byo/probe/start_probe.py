"""What a started process looks like from inside, as JSON in the file named by argv[1]:
the equivalence tests of a preloaded start (tests/byo/test_preloaded_start.py) compare it
with an exec'd one's."""
import probe_warm  # first: whether torch._dynamo was there before this script imported anything
import atexit
import faulthandler
import json
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import time

import torch
import torch.multiprocessing
from torch.utils.data import DataLoader

import probe_helper  # beside this script: the script's folder is first on sys.path
import reports       # the harness has a package of that name: the job's own must win


def probe() -> None:
    facts = {
        "argv": sys.argv, "file": __file__, "name": __name__, "cwd": os.getcwd(),
        "path": sys.path[:2], "helper": probe_helper.WHERE, "reports": reports.WHERE,
        "threads": torch.get_num_threads(), "cuda_initialized": torch.cuda.is_initialized(),
        "env": {k: os.environ.get(k) for k in ("PROBE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")},
        "signals": {s.name: str(signal.getsignal(s)) for s in signal.valid_signals()
                    if signal.getsignal(s) not in (signal.SIG_DFL, None)},
        "stdout": [sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding, sys.stdout.errors],
        "stderr": [sys.stderr.line_buffering, sys.stderr.write_through, sys.stderr.errors],
        "stdin": sys.stdin.read(),
        "faulthandler": faulthandler.is_enabled(),
        "dynamo_log_level": logging.getLogger("torch._dynamo").level,
        "hook": "chaos_hook" in sys.modules,
        "random": random.random(), "torch_random": torch.rand(1).item(),
        "dont_write_bytecode": sys.dont_write_bytecode,
        "main_module": sys.modules["__main__"].__dict__.get("__file__"),
        "warm": probe_warm.WARM,
        "cmdline": open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode(),
        "tempdir": tempfile.gettempdir(),
    }
    if "loader" in sys.argv[2:]:
        for method in ("fork", "spawn"):
            loader = DataLoader(list(range(4)), batch_size=2, num_workers=1,
                                multiprocessing_context=torch.multiprocessing.get_context(method))
            facts[f"loader_{method}"] = [batch.tolist() for batch in loader]
    # whole, where two ranks write it; mkstemp's name, not the pid, since ranks in two
    # containers have their own pid namespaces and can share a pid
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(sys.argv[1]) or ".", prefix="facts-")
    with os.fdopen(fd, "w") as f:
        json.dump(facts, f)
    os.replace(partial, sys.argv[1])

    atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").write("ran"))
    threading.Thread(target=later).start()  # not a daemon: Python waits for it before atexit
    if "steps" in sys.argv[2:]:  # for a run under the harness: optimizer steps its hook counts
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            time.sleep(0.2)


def later() -> None:
    time.sleep(0.2)
    with open(sys.argv[1] + ".thread", "w") as f:
        f.write("joined")


if __name__ == "__main__":  # a spawned data loader worker imports this file as __mp_main__
    probe()
    how = os.environ.get("PROBE_END", "")
    if how == "raise":
        raise ValueError("the probe's own error")
    if how == "interrupt":
        raise KeyboardInterrupt
    sys.exit(int(how or 0))
