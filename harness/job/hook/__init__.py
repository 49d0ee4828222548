"""What runs inside the user's training process, put there without changing its code.

This folder goes first on the job's PYTHONPATH (harness.cluster.userjob): Python's `site`
imports `sitecustomize` at startup, which calls `chaos_hook.install()`. The hook writes
straight into the trial's events file (CHAOS_EVENTS_PATH; one O_APPEND write per event):

    rank_start   once, when the process starts (a restart is a new pid)
    step         after every optimizer step (torch's global optimizer step post-hook,
                 registered when the script imports torch.optim; nothing is imported early)

A script without torch.optim opts in with one line in its training loop:

    import chaos_hook; chaos_hook.step()     # a no-op outside the harness

Nothing here imports torch or the harness; only runfolder (standard library).
"""
