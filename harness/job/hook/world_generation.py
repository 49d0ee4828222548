"""One generation for every process of a world an elastic agent started (torchrun, ft_launcher).

Each agent counts its own restarts (TORCHELASTIC_RESTART_COUNT): after a host's agent was
killed and started again, its workers count 0 while the survivors' count 1, yet they train
as one world. The reports key a world's steps by their generation, so the hook agrees on
one: the largest count among the world's processes, raised on the store torchrun makes for
each round of workers (a new one every round, so nothing of an earlier world is read).

The agreement never holds the job up past `deadline_s`: it talks to the store over a
connection of its own, on a daemon thread, so a store that stops answering can neither
block the job's own store calls (they would queue behind ours on a shared client) nor keep
the process waiting; a world that does not agree in time keeps its own counts (None).
"""
from __future__ import annotations

import threading
from datetime import timedelta

KEY = "chaos_hook/generation"
ARRIVED = "chaos_hook/generation_arrived"
DONE = "chaos_hook/generation_done"


def agree(address: str, port: int, world: int, own: int, deadline_s: float) -> int | None:
    """The largest of `own` and the other `world - 1` processes' counts, once all of them
    raised it; None where that is not known within `deadline_s`."""
    found: list[int] = []

    def raise_and_read() -> None:
        from torch.distributed import TCPStore
        try:
            store = TCPStore(address, port, is_master=False, timeout=timedelta(seconds=deadline_s),
                             wait_for_workers=False)
            current = store.compare_set(KEY, "", str(own)).decode()
            while int(current) < own:
                current = store.compare_set(KEY, current, str(own)).decode()
            if store.add(ARRIVED, 1) == world:
                store.set(DONE, "1")
            store.wait([DONE])
            found.append(int(store.get(KEY)))
        except (RuntimeError, ValueError):  # torch's store errors are RuntimeErrors: not agreed
            return

    thread = threading.Thread(target=raise_and_read, name="chaos-hook-generation", daemon=True)
    thread.start()
    thread.join(deadline_s)
    return found[0] if found else None
