"""The exceptions of the chaos harness, in one tree.

    ChaosError                     base of everything raised on purpose
    ├── UsageError                 bad input from a user: file, field, value, and the fix
    │   ├── InvalidFault           a fault value that fails validation
    │   └── FaultConflict          a fault that cannot join what its link already carries
    ├── UnsupportedFault           this kernel/machine cannot inject the fault faithfully
    ├── InjectionError             the kernel refused an apply or a revert (netlink, bpf, nft)
    └── HarnessError               the job could not be run (bring-up, launch, control plane)
        └── DeadlineExceeded       a wait ran past its deadline

Third-party errors (pyroute2's NetlinkError, OSError from syscalls, docker.errors) are
translated once, at the edge that calls them, with ``raise ... from exc``. The only
error a revert tolerates is the exact "already gone" one (ENOENT / ENODEV / ESRCH).
"""
from __future__ import annotations

import errno


class ChaosError(Exception):
    """Base of every error the harness raises on purpose."""


class UsageError(ChaosError):
    """Bad input from a user; the message names the problem and the fix. CLI exit code 2."""


class InvalidFault(UsageError):
    """A fault value that fails validation (kind, field, value, accepted form)."""


class FaultConflict(UsageError):
    """Two faults on one link that cannot compose into one effect: the second is refused."""


class UnsupportedFault(ChaosError):
    """This kernel or machine cannot inject the fault faithfully; it is refused, not weakened."""


class InjectionError(ChaosError):
    """The kernel refused to apply or revert a fault; `errno` keeps the kernel's reason."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class TargetGone(InjectionError):
    """A process fault's target ended before its signal reached it: a race with the job
    (a rank that crashed or exited that moment), not the harness's error."""


class HarnessError(ChaosError):
    """The job could not be brought up, launched or observed."""


class DeadlineExceeded(HarnessError):
    """A wait ran past its deadline."""


# errno values that mean "the object is already gone": the only errors a revert tolerates.
ALREADY_GONE = frozenset({errno.ENOENT, errno.ENODEV, errno.ESRCH})
