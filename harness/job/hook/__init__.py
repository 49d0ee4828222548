"""What runs inside the user's training process, put there without changing its code.

This folder goes first on the job's PYTHONPATH (harness.cluster.userjob): Python's `site`
imports `sitecustomize` at startup, which calls `chaos_hook.install()`. The hook writes
straight into the trial's events file (CHAOS_EVENTS_PATH; one O_APPEND write per event):

    rank_start   once, when the process starts (a restart is a new pid; `restart`: torchrun's
                 restart count, which a restart for a host that joined does not raise)
    step         after every optimizer step (torch's global optimizer step post-hook,
                 registered when the script imports torch.optim; nothing is imported early)
    state        fingerprints of the parameters and the optimizer's state: before the
                 process's first step (at start) and every `job.state_every` steps after
    checkpoint_save, checkpoint_load
                 each torch.save / torch.load and torch.distributed.checkpoint save / load
                 with a path: the path, the process's step and the file's identity (inode,
                 modification time, size), which reports.checkpoints traces across trials

A script without torch.optim opts in with one line in its training loop:

    import chaos_hook; chaos_hook.step()     # a no-op outside the harness
    chaos_hook.step(model)                   # the same, with the model's fingerprint

Nothing here imports torch or the harness at start; only runfolder (standard library).
The fingerprints import harness.job.fingerprint (torch only) once the job has torch.
"""
