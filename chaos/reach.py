"""Why this process cannot use a path a user gave, in words.

`os.path.isfile` and `Path.exists` answer False both for a path that is not there and for
one behind a folder this user may not enter; the two need different fixes (another path,
or a chmod by the owner), so a check of a user's path says which one it met.
"""
from __future__ import annotations

import os
import pwd
import stat

from chaos import userns


def why_unreadable(path: str | os.PathLike[str], folder: bool = False) -> str | None:
    """None where this process can read `path` (a file) or enter it (`folder`); else why
    not: "no such file", "not a file", or "cannot be read by uid N (permission denied on
    D, ...)" naming the first component D that stops it and the chmod that lets it through."""
    full = os.path.realpath(path)  # a symlink's target is what has to be reached
    parts = full.split(os.sep)[1:]
    reached = os.sep
    for part in parts:
        below = os.path.join(reached, part)
        try:
            os.stat(below)
        except PermissionError:
            return _denied(reached, "x")
        except (FileNotFoundError, NotADirectoryError):
            return f"no such {'folder' if folder else 'file'}"
        reached = below
    mode = os.stat(full).st_mode
    if folder != stat.S_ISDIR(mode) or not (folder or stat.S_ISREG(mode)):
        return "not a folder" if folder else "not a file"
    try:
        if folder:
            os.stat(os.path.join(full, "."))  # entering it is what a search of it takes
        else:
            open(full, "rb").close()  # a regular file: opening it does not block
    except PermissionError:
        return _denied(full, "x" if folder else "r")
    return None


def _denied(path: str, bit: str) -> str:
    """The message for `path` refusing this user `bit` (x: enter it, r: read it). In the user
    namespace of a rootless run the uid is the one outside, which the kernel checks, and
    the owner is not said: one outside the namespace reads as the overflow uid there."""
    info = os.stat(path)
    owner = ""
    if not userns.entered():
        try:
            owner = f", owner {pwd.getpwuid(info.st_uid).pw_name}"
        except KeyError:
            owner = f", owner uid {info.st_uid}"
    uid = os.environ.get(userns.USERNS_ENV, str(os.geteuid()))
    let = "through" if bit == "x" else "read it"
    return (f"cannot be read by uid {uid} (permission denied on {path}: mode {stat.S_IMODE(info.st_mode):04o}"
            f"{owner}; `chmod a+{bit} {path}` by its owner lets others {let})")
