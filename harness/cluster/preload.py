"""A user's job started from a warm interpreter (`job.start: preloaded`, the default).

The rank launcher (harness.cluster.zygote; on the docker backend the container's PID 1)
imports once what training scripts import (`PRELOAD`, and the scenario's `job.preload`),
then forks one child per rank that becomes `python train.py ...` without a new
interpreter: the fork shares torch's pages and skips its import (seconds per rank, tens of
seconds for DistributedDataParallel's torch._dynamo on a busy host).

The child is made to look like a fresh `python` run by the command, in this order:

    command      `python [-u] [-B] [-X faulthandler] SCRIPT|-m MODULE ARGS`, `python` being
                 this interpreter (PATH of the job's env, or a script whose `#!` names it,
                 as torchrun's); anything else is exec'd (`how_to_start` says why)
    environment  the job's, replacing the launcher's; a variable that Python or torch
                 reads only when it starts or is imported, set differently from the
                 launcher's, makes it exec instead (IMPORT_TIME_ENV), except those
                 applied here: OMP_NUM_THREADS (torch's intra-op threads, capped at
                 torch's default as torch's import caps it), TORCH_LOGS,
                 PYTHONPATH, PYTHONUNBUFFERED, PYTHONFAULTHANDLER, PYTHONDONTWRITEBYTECODE
    cwd, argv    the launch's; sys.argv as Python gives it; the title in /proc (ps, py-spy)
                 is the command's, cut to the launcher's own command line's length
    sys.path     the script's folder (-m: the working directory), PYTHONPATH, then the
                 interpreter's own; the project's modules the launcher imported (harness,
                 chaos, runfolder, reports) are forgotten, so the job's own of those names win
    site         `sitecustomize` run again from the new path (the step hook's)
    signals      as Python sets them: SIGINT raises KeyboardInterrupt, SIGPIPE and SIGXFSZ
                 ignored, the rest default, except what the launcher's parent ignored
    streams      new sys.stdin/stdout/stderr on fds 0-2, buffered as Python buffers them
    randomness   `random`, numpy's and torch's generators reseeded from the OS, as each
                 fresh process is
    __main__     a new module with the script's absolute __file__; -m through runpy, as
                 Python does; `if __name__ == "__main__":` holds
    exit         SystemExit's code, 1 and the traceback for an uncaught exception, SIGINT
                 for an uncaught KeyboardInterrupt; then non-daemon threads are joined
                 and atexit handlers run, as Python's finalisation does

What stays the launcher's: sys.flags and sys.orig_argv, the hash seed of str (every rank
hashes alike), modules torch itself imported (the same files a fresh import would load).
A torchrun agent started so first forks its host's worker server, from which its workers
fork the same way (harness.cluster.workers). Data loader workers fork from the child (the default on Linux) or are spawned with this
interpreter and the script's path, as from a fresh one. CUDA is never initialised by the
launcher, so CUDA_VISIBLE_DEVICES of each rank's env holds when the script first uses it.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


# What a DDP script imports; torch._dynamo is what DistributedDataParallel pulls in (~2 s
# alone, ~20 s per rank with 16 ranks importing it at once on 2 cores).
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "torch.utils.data",
           "torch.distributed.elastic.multiprocessing")
# Read once, when Python starts or torch is imported: a job that sets them otherwise than
# the launcher had them is exec'd. Prefixes; APPLIED are set up in the child instead.
IMPORT_TIME_ENV = ("PYTHON", "TORCH", "PYTORCH", "KMP_", "MKL_", "OMP_", "GOMP_", "LD_")
APPLIED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_LOGS", "PYTHONPATH", "PYTHONUNBUFFERED",
               "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE")
# read when used, not at import: the process group's, the elastic agent's, CUDA's, torchft's
LAZY_ENV = ("TORCH_NCCL_", "TORCH_DISTRIBUTED_DEBUG", "TORCHELASTIC_", "TORCH_CPP_LOG_LEVEL",
            "PYTORCH_CUDA_ALLOC_CONF", "TORCH_SHOW_CPP_STACKTRACES", "TORCHFT_")
FLAGS = {"u": "unbuffered", "B": "no_bytecode"}
PROJECT_PACKAGES = ("harness", "chaos", "runfolder", "reports")
_THREADS_ENV = {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}

_launcher_threads = 0  # torch's intra-op default in the launcher, before it set 1
_launcher_environ: dict[str, str] | None = None  # before its imports (torch's set some variables)


def remember_launcher() -> None:
    """The launcher's environment before it imports torch: the one the jobs' are compared
    with; what the imports add to it, a fresh process's imports would add too."""
    global _launcher_environ
    _launcher_environ = dict(os.environ)


@dataclass(frozen=True)
class Start:
    """How a preloaded child runs the command."""

    argv0: str                  # sys.argv[0] as Python sets it before running (the script as typed; -m: "-m")
    title: tuple[str, ...]      # /proc/PID/cmdline after an exec
    script: str | None          # the script's absolute path, or None with `module`
    module: str | None
    args: tuple[str, ...]
    unbuffered: bool = False
    no_bytecode: bool = False
    faulthandler: bool = False


def import_all(modules: tuple[str, ...] | list[str]) -> str | None:
    """In the launcher, before it forks: import `modules` (PRELOAD first); why not, or None.
    No module may start a thread or initialise CUDA: a fork copies neither."""
    global _launcher_threads
    import importlib
    import torch  # its own native thread is there from its import on, and torch never uses it across a fork
    tasks = len(os.listdir("/proc/self/task"))
    for name in (*PRELOAD, *modules):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import error is the user's to read
            return (f"job.preload: importing {name!r} in the rank launcher failed: {type(exc).__name__}: {exc}; "
                    "install it where chaos runs, or drop it from job.preload")
        if len(os.listdir("/proc/self/task")) > tasks:
            return (f"job.preload: importing {name!r} started a thread in the rank launcher, which a fork "
                    "does not copy; drop it from job.preload (the script imports it itself), or set "
                    "job.start: exec")
    if not _launcher_threads and not _THREADS_ENV & set(os.environ):
        _launcher_threads = torch.get_num_threads()
    # Never garbage (modules, functions, torch's tables): frozen, a child's collections do not
    # walk them, and so do not copy every page that holds them (copy-on-write).
    import gc
    gc.freeze()
    if torch.cuda.is_initialized():
        return "job.preload: an import initialised CUDA in the rank launcher; drop it from job.preload"
    return None


def remember_default_threads(count: int) -> None:
    """torch's intra-op thread count in the launcher before it set its own: what a job
    without OMP_NUM_THREADS gets, and the most a job's OMP_NUM_THREADS gets (torch caps it
    there when it reads it at import)."""
    global _launcher_threads
    if not _THREADS_ENV & set(os.environ):  # else the launcher's own setting, not torch's default
        _launcher_threads = count


def _same_interpreter(path: str) -> bool:
    # a venv is its bin folder: the same file in another folder is another environment
    try:
        return (os.path.samefile(path, sys.executable)
                and os.path.realpath(os.path.dirname(os.path.abspath(path)))
                == os.path.realpath(os.path.dirname(sys.executable)))
    except OSError:
        return False


def _program(argv0: str, cwd: str, env: dict[str, str]) -> str | None:
    if "/" in argv0:
        path = os.path.join(cwd, argv0)
        return path if os.access(path, os.X_OK) else None
    return shutil.which(argv0, path=env.get("PATH", os.defpath))


def _shebang_python(path: str, env: dict[str, str]) -> bool:
    """Whether the file at `path` is a script run by this interpreter (`#!/…/python`, or
    `#!/usr/bin/env python`), with no option on that line."""
    try:
        with open(path, "rb") as f:
            line = f.readline(512)
    except OSError:
        return False
    if not line.startswith(b"#!"):
        return False
    words = line[2:].decode(errors="replace").split()
    if len(words) == 2 and os.path.basename(words[0]) == "env":
        found = shutil.which(words[1], path=env.get("PATH", os.defpath))
        return found is not None and _same_interpreter(found)
    return len(words) == 1 and _same_interpreter(words[0])


def _before_imports() -> dict[str, str]:
    return os.environ if _launcher_environ is None else _launcher_environ  # type: ignore[return-value]


def _env_problem(env: dict[str, str]) -> str | None:
    launcher = _before_imports()
    for name in sorted(set(env) | set(launcher)):
        if (name.startswith(IMPORT_TIME_ENV) and not name.startswith(LAZY_ENV) and name not in APPLIED_ENV
                and env.get(name) not in (launcher.get(name), os.environ.get(name))):  # as before or after its imports
            return f"{name} is read when Python starts or torch is imported, and the job sets it otherwise"
    return None


def how_to_start(launch: dict[str, Any]) -> Start | str:
    """How a child of this launcher can run the launch's command, or why it must be exec'd."""
    if (problem := _env_problem(launch["env"])) is not None:
        return problem
    argv, cwd, env = launch["argv"], launch["cwd"], launch["env"]
    program = _program(argv[0], cwd, env)
    if program is None:
        return f"{argv[0]!r} is not found"  # exec reports it as a fresh start would
    if not _same_interpreter(program):
        if not _shebang_python(program, env):
            return f"{argv[0]} is not this Python ({sys.executable})"
        return Start(argv0=program, title=(sys.executable, program, *argv[1:]), script=program, module=None,
                     args=tuple(argv[1:]))
    flags: dict[str, bool] = {"unbuffered": False, "no_bytecode": False, "faulthandler": False}
    rest = list(argv[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-":
        option = rest.pop(0)
        if option == "-m" and rest:
            return Start(argv0="-m", title=tuple(argv), script=None, module=rest[0], args=tuple(rest[1:]), **flags)
        if option == "-X" and rest[:1] == ["faulthandler"]:
            rest.pop(0)
            flags["faulthandler"] = True
        elif option[1:] and all(letter in FLAGS for letter in option[1:]):
            flags.update({FLAGS[letter]: True for letter in option[1:]})
        else:
            return f"python option {option} is not one a preloaded start can give"
    if not rest or rest[0] == "-":
        return "python reads its program from stdin"
    script = os.path.join(cwd, rest[0])
    if not os.path.isfile(script):
        return f"{rest[0]} is not a file"  # exec reports it as a fresh start would
    return Start(argv0=rest[0], title=tuple(argv), script=os.path.abspath(script), module=None,
                 args=tuple(rest[1:]), **flags)


# -- in the forked child --------------------------------------------------------------------

def run(start: Start, launch: dict[str, Any]) -> int:
    """Become the command in this process (a fork of the launcher); returns its exit code."""
    env = launch["env"]
    ignored = {s for s in signal.valid_signals() if _ignored(s)}
    os.chdir(launch["cwd"])
    launcher_path = _launcher_pythonpath()
    launcher_logs = os.environ.get("TORCH_LOGS")
    before = _before_imports()
    set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v and k not in env}
    os.environ.clear()
    os.environ.update({**env, **set_by_imports})
    tempfile.tempdir = None  # as in a new Python, read from TMPDIR: the launcher's may differ
    set_title(start.title)
    sys.argv = [start.argv0, *start.args]
    first = os.path.dirname(start.script) if start.script else os.getcwd()
    interpreter = [p for p in sys.path[1:] if p not in launcher_path]
    sys.path[:] = [first, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), *interpreter]
    sys.dont_write_bytecode = start.no_bytecode or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    _reset_signals(ignored)
    _streams(start.unbuffered or bool(env.get("PYTHONUNBUFFERED")))
    if start.faulthandler or env.get("PYTHONFAULTHANDLER"):
        import faulthandler
        faulthandler.enable()
    _fresh_torch(env, relog=env.get("TORCH_LOGS") != launcher_logs)
    _forget_project_modules()
    _site()
    return _finish(_main(start))


def _ignored(number: int) -> bool:
    try:
        return signal.getsignal(number) is signal.SIG_IGN and number not in (signal.SIGPIPE, signal.SIGXFSZ)
    except (OSError, ValueError):
        return False


def _reset_signals(ignored: set[int]) -> None:
    """What a new Python has: exec keeps what was ignored (but SIGPIPE and SIGXFSZ, which
    Python itself ignores) and makes every handler the default."""
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(number, signal.SIG_IGN if number in ignored else signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _launcher_pythonpath() -> set[str]:
    return {sys.path[0], *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))}


def set_title(argv: tuple[str, ...]) -> None:
    """/proc/PID/cmdline (ps, py-spy, the harness's stacks) shows the command, cut to the
    room the launcher's own command line left."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48, 49)
        title = b"\0".join(a.encode() for a in argv)[: end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(title.ljust(end - start, b"\0"))
    except (OSError, ValueError, IndexError):
        pass  # the title is for people; the job runs the same without it


def _streams(unbuffered: bool) -> None:
    import io

    def stream(fd: int, write: bool, errors: str, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w" if write else "r", closefd=False)
        buffered = raw if unbuffered and write else (io.BufferedWriter(raw) if write else io.BufferedReader(raw))
        return io.TextIOWrapper(buffered, encoding=sys.__stdout__.encoding if sys.__stdout__ else "utf-8",
                                errors=errors, line_buffering=line, write_through=unbuffered and write)

    errors = sys.__stdout__.errors if sys.__stdout__ else "strict"
    sys.stdin = sys.__stdin__ = stream(0, False, errors, False)
    sys.stdout = sys.__stdout__ = stream(1, True, errors, False)
    sys.stderr = sys.__stderr__ = stream(2, True, "backslashreplace", not unbuffered)


def _fresh_torch(env: dict[str, str], relog: bool) -> None:
    import random
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    torch = sys.modules.get("torch")
    if torch is None:
        return
    torch.seed()
    default = _launcher_threads or os.cpu_count() or 1
    threads = env.get("OMP_NUM_THREADS") or env.get("MKL_NUM_THREADS")
    torch.set_num_threads(min(int(threads), default) if threads and threads.isdigit() and int(threads) > 0
                          else default)
    if relog:  # torch read the launcher's when it was imported
        torch._logging._internal._init_logs()


def _forget_project_modules() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in PROJECT_PACKAGES]:
        del sys.modules[name]


def _site() -> None:
    """`site` imports sitecustomize (and usercustomize) from sys.path at start: again, from
    the job's path (the step hook's is first there)."""
    import importlib
    for name in ("sitecustomize", "usercustomize"):
        sys.modules.pop(name, None)
        try:
            importlib.import_module(name)
        except ImportError as exc:
            if exc.name != name:
                raise


def _main(start: Start) -> int:
    import builtins
    import importlib.machinery
    import types
    try:
        if start.module is not None:
            import runpy
            runpy._run_module_as_main(start.module, alter_argv=True)  # type: ignore[attr-defined]
        else:
            assert start.script is not None
            main = types.ModuleType("__main__")
            main.__dict__.update(__file__=start.script, __cached__=None, __builtins__=builtins,
                                 __loader__=importlib.machinery.SourceFileLoader("__main__", start.script))
            sys.modules["__main__"] = main
            with open(start.script, "rb") as f:
                code = compile(f.read(), start.script, "exec", dont_inherit=True)
            exec(code, main.__dict__)
        return 0
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        _print_uncaught()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _finish(0)
        os.kill(os.getpid(), signal.SIGINT)  # as Python ends on an uncaught KeyboardInterrupt
        return 130
    except BaseException:  # noqa: BLE001 - the script's uncaught exception, printed as Python does
        _print_uncaught()
        return 1


def _print_uncaught() -> None:
    kind, value, tb = sys.exc_info()
    if value is not None and tb is not None:
        value = value.with_traceback(tb.tb_next)  # from the script's frame on, not this module's
    sys.excepthook(kind, value, value.__traceback__ if value is not None else None)  # type: ignore[arg-type]


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """Python's finalisation: wait for the non-daemon threads, run atexit, flush."""
    import atexit
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    return code
