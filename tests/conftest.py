"""What privileged tests need, and the session-wide fixtures.

Capabilities: each test that needs one (a marker below, or a scenario file's fault kind
that only a probed kernel mechanism injects) skips, saying why, where the machine lacks
it. CHAOS_REQUIRE (comma-separated names of CAPABILITIES; .ci/run sets it) lists the ones
the machine must have: where a collected test needs one of those and it is missing, the
session fails at collection, naming it and why, instead of turning its tests into skips.
CHAOS_TEST_HIDE takes the capabilities it names for missing (tests/test_require.py shows
CI failing and a user's machine skipping on one).

The session's host check is tests/session.py's, registered by the repository's conftest.py.
`stop_child` ends a helper harness a test started, whatever happens."""
from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parent.parent
REQUIRE = "CHAOS_REQUIRE"
HIDE = "CHAOS_TEST_HIDE"
# the planted defects' scenarios are for `chaos explore` (tests/run/test_explore_planted.py,
# bench/explore_planted.py), not scenario tests: fault-free, they would only cost CI time
collect_ignore_glob = ["run/planted/*.yaml"]
# kernel mechanisms the capability probe tries (chaos.probe, `chaos doctor`)
PROBED = ("netem", "clsact_bpf", "nft_bridge", "tbf", "nfqueue_delay")


def _names(variable: str) -> set[str]:
    return {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}


def _root() -> str | None:
    return None if os.geteuid() == 0 else "needs root (network namespaces, netlink)"


def _gpu() -> str | None:
    import torch
    return None if torch.cuda.is_available() else "needs a CUDA device; none is visible to torch"


def _uml_netem() -> str | None:
    if shutil.which("linux.uml") is None or shutil.which("modprobe") is None:
        return "needs User-Mode Linux (apt-get install user-mode-linux kmod: .ci/uml-kernel.sh)"
    if not glob.glob("/usr/lib/uml/modules/*/kernel/net/sched/sch_netem.ko*"):
        return "User-Mode Linux is installed without a sch_netem module (/usr/lib/uml/modules)"
    return None


def _docker() -> str | None:
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the Docker SDK for Python is not installed (pip install 'chaos-harness[docker]')"
    from harness.cluster.docker.engine import engine_unavailable_reason
    return engine_unavailable_reason()


def compose_command() -> list[str] | None:
    """The Compose a user runs here: `docker-compose` (1.29, Debian's; CI installs it:
    .ci/docker-engine.sh) or the v2 plugin `docker compose`; None: neither."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 timeout=30).returncode == 0:
        return ["docker", "compose"]
    return None


def _compose() -> str | None:
    if compose_command() is None:
        return ("needs Compose: `docker-compose` (apt-get install docker-compose) or the "
                "`docker compose` plugin (.ci/docker-engine.sh installs the first)")
    return _docker()


def _probed(check: str) -> Callable[[], str | None]:
    def why_not() -> str | None:
        from chaos import probe
        caps = probe.capabilities()
        return None if getattr(caps, check) else f"needs {check}: {caps.why_not(check)}"
    return why_not


def _fuse() -> str | None:
    from chaos.fusefs import why_no_fuse
    reason = why_no_fuse()
    return None if reason is None else f"needs FUSE for the FUSE storage faults: {reason} (.ci/fuse.sh)"


def _fuse_user() -> str | None:
    """FUSE for an ordinary user too: /dev/fuse open to every user, as distributions make it."""
    reason = _fuse()
    mode = os.stat("/dev/fuse").st_mode & 0o777 if reason is None else 0
    if reason is None and mode & 0o006 != 0o006:
        reason = (f"needs /dev/fuse open to an ordinary user for the rootless FUSE faults: it is mode {mode:o} "
                  "(.ci/fuse.sh makes it 666, as udev does)")
    return reason


def _cgroup_cpu() -> str | None:
    from chaos.cgroup import why_no_cpu_cap
    reason = why_no_cpu_cap()
    return None if reason is None else f"needs the cgroup CPU controller for `slow`'s quota: {reason}"


# name: why it is missing (None: present)
CAPABILITIES: dict[str, Callable[[], str | None]] = {
    "root": _root, "gpu": _gpu, "uml_netem": _uml_netem, "docker": _docker, "compose": _compose, "fuse": _fuse,
    "fuse_user": _fuse_user, "cgroup_cpu": _cgroup_cpu,
    **{check: _probed(check) for check in PROBED}}
# required here, checked elsewhere: tests/slurm/conftest.py fails its collection on CHAOS_REQUIRE_SLURM
CHECKED_ELSEWHERE = {"slurm"}
# the tests the quick loop (`./dev.sh check`) leaves out, declared in each such test file
SYSTEM = "system"
# a marker: the capability it names (requires_mechanism("tbf") names its own)
MARKERS = {"requires_root": "root", "requires_gpu": "gpu", "requires_netem": "netem",
           "requires_uml": "uml_netem", "requires_docker": "docker", "requires_compose": "compose",
           "requires_fuse": "fuse", "requires_fuse_user": "fuse_user", "requires_cgroup_cpu": "cgroup_cpu"}


@functools.cache
def why_missing(name: str) -> str | None:
    if name in _names(HIDE):
        return f"{name} is taken for missing here ({HIDE})"
    return CAPABILITIES[name]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_mechanism(check): needs a kernel mechanism the capability "
                                       f"probe tries (one of {', '.join(PROBED)})")
    config.addinivalue_line("markers", f"{SYSTEM}: starts real processes, a daemon or sockets (a job, a store, a "
                                       "launcher), or needs root or a kernel mechanism: `./dev.sh check` "
                                       "leaves it out (a requires_* marker and a scenario trial imply it)")
    known = [*CAPABILITIES, *sorted(CHECKED_ELSEWHERE)]
    unknown = sorted(_names(REQUIRE) - set(known))
    if unknown:
        raise pytest.UsageError(f"{REQUIRE} names unknown capabilities {', '.join(unknown)}; "
                                f"known: {', '.join(known)}")
    if "slurm" in _names(REQUIRE):
        os.environ["CHAOS_REQUIRE_SLURM"] = "1"
    hidden = _names(HIDE) & set(PROBED)
    if hidden:  # the scenario plugin asks the probe, not this file, which fault kinds it can inject
        from chaos import probe
        real = probe.probe

        def without_hidden() -> probe.Capabilities:
            caps = real()
            return dataclasses.replace(caps, **dict.fromkeys(hidden, False),
                                       reasons={**caps.reasons, **{c: why_missing(c) for c in hidden}})
        probe.probe = without_hidden


def pytest_itemcollected(item: pytest.Item) -> None:
    """What needs a capability, and every scenario trial (a real job), is `system` too; set
    as each item is collected, before `-m` selects."""
    if _needs(item) or item.get_closest_marker("chaos_scenario"):
        item.add_marker(SYSTEM)


def _needs(item: pytest.Item) -> list[str]:
    needs = [name for marker, name in MARKERS.items() if item.get_closest_marker(marker)]
    needs += [m.args[0] for m in item.iter_markers("requires_mechanism")]
    return needs


def _scenario_needs(item: pytest.Item) -> list[str]:
    """For a scenario trial the plugin skips because a fault kind cannot be injected here:
    the probed mechanisms missing here each of which would let one more kind be injected."""
    from harness.pytest_plugin import ScenarioTest
    if not isinstance(item, ScenarioTest):
        return []
    from harness.cluster.backends import traits_of
    if not traits_of(item.scenario.cluster.backend).network_faults:
        return []
    from chaos import probe
    from chaos.inject import choose_mechanisms
    from chaos.mechanism import Unavailable
    caps = probe.capabilities()
    kinds = {event.fault.kind for event in item.scenario.faults}

    def refused(with_caps: probe.Capabilities) -> set[str]:
        chosen = choose_mechanisms(with_caps)
        return {kind for kind in kinds if isinstance(chosen[kind], Unavailable)}
    now = refused(caps)
    return [check for check in PROBED if now and not getattr(caps, check)
            and refused(dataclasses.replace(caps, **{check: True})) < now]


# What one daemon of this machine serves is tested one at a time, on one pytest-xdist worker
# (`./dev.sh test` runs two, --dist loadgroup): the local Slurm cluster, the Docker engine
# (whose tests list its containers and networks), a User-Mode Linux kernel.
SHARED_DAEMONS = {"docker": "docker", "compose": "docker", "uml_netem": "uml"}


def _daemon_group(item: pytest.Item) -> str | None:
    if item.path.is_relative_to(Path(__file__).parent / "slurm"):
        return "slurm"
    return next((SHARED_DAEMONS[name] for name in _needs(item) if name in SHARED_DAEMONS), None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    required = _names(REQUIRE)
    lacking: dict[str, list[str]] = {}
    for item in items:
        if group := _daemon_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
        missing = [name for name in _needs(item) if why_missing(name)]
        # a test that skips for a capability not required skips, whatever else it lacks
        optional = [name for name in missing if name not in required]
        if optional:
            item.add_marker(pytest.mark.skip(reason=why_missing(optional[0])))
            continue
        # the plugin skips the trial, saying why; it fails here if it lacks one CI requires
        missing = missing or [name for name in _scenario_needs(item) if name in required]
        for name in missing:
            lacking.setdefault(name, []).append(item.nodeid)
    if lacking:
        raise pytest.UsageError(f"{REQUIRE} requires capabilities this machine lacks, which these tests need:\n"
                                + "\n".join(f"  {name}: {why_missing(name)}\n    needed by {ids[0]}"
                                            + (f" and {len(ids) - 1} more" if len(ids) > 1 else "")
                                            for name, ids in lacking.items()))


def stop_child(child: subprocess.Popen, grace_s: float = 30.0, run_id: str | None = None) -> None:
    """End a helper harness a test started: SIGINT (it cleans up on its way out), SIGKILL at
    the deadline, then a heal of `run_id`; never raises for a child already gone."""
    from harness.cluster.host import end_process
    end_process(child, signal.SIGINT, grace_s)
    if run_id is not None:
        from chaos.heal import heal
        from harness.cluster.undos import undo_table
        heal(undo_table(), run_id)


def chaos_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("chaos-")}


def leftovers(folder: Path) -> list[str]:
    """What the runs recorded under `folder` left on this host: namespaces, CPU cgroups and
    the hosts' temporary folders named after their run ids, their ledgers, rank processes
    still alive, and mounts below it."""
    from chaos.cgroup import cpu_hierarchy
    from chaos.ledger import state_dir
    from chaos.storage import mounts_below
    found = [f"mount on {path}" for path in mounts_below(str(folder))]
    namespaces = chaos_namespaces()
    hierarchy = cpu_hierarchy()
    for trial in folder.rglob("trial.json"):
        run_id = json.loads(trial.read_text())["run_id"]
        found += sorted(n for n in namespaces if n.startswith(f"chaos-{run_id}-"))
        found += sorted(str(p) for p in Path(hierarchy.mount).glob(f"chaos-{run_id}-*")) if hierarchy else []
        found += sorted(str(p) for p in Path(tempfile.gettempdir()).glob(f"chaos-{run_id}-*"))
        if (state_dir() / f"{run_id}.jsonl").exists():
            found.append(f"ledger {run_id}")
        events = trial.parent / "events.jsonl"
        for line in events.read_text().splitlines() if events.exists() else []:
            event = json.loads(line)
            if event["kind"] == "rank_spawned" and Path(f"/proc/{event['pid']}").exists():
                found.append(f"rank {event['rank']} pid {event['pid']}")
    return found


@pytest.fixture
def leaves_nothing(tmp_path):
    """Asserts that the runs a test made under tmp_path left nothing on the host."""
    yield
    assert leftovers(tmp_path) == []


# the console script pip installed beside this interpreter, as a user runs it
CHAOS = str(Path(sys.executable).parent / "chaos")


def chaos_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run the installed `chaos` command as a user would."""
    kwargs.setdefault("cwd", REPO)
    return subprocess.run([CHAOS, *args], capture_output=True, text=True, **kwargs)


# -- an ordinary user (uid 65534), for the no-root paths ----------------------------------

NOBODY = 65534


@pytest.fixture
def user_dir():
    """A folder of uid 65534's own (pytest's temporary folders are root's, mode 700)."""
    folder = Path(tempfile.mkdtemp(prefix="chaos-local-test-"))
    os.chown(folder, NOBODY, NOBODY)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_nobody(folder: Path, *args: str, **kwargs) -> subprocess.Popen | subprocess.CompletedProcess:
    """`chaos ARGS` (with python=True: `python ARGS`) as uid 65534, with its state folder
    (ledgers) in `folder`; env=: the environment to start from (default this process's);
    prefix=: a command that execs the rest (argv) as root first."""
    program = str(Path(sys.executable).parent / "python") if kwargs.pop("python", False) else CHAOS
    argv = [*kwargs.pop("prefix", ()), "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", program, *args]
    env = {**kwargs.pop("env", os.environ), "HOME": str(folder), "USER": "nobody",
           "CHAOS_STATE_DIR": str(folder / "state")}
    if kwargs.pop("background", False):
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, **kwargs)


def processes_of(uid: int, folder: Path) -> list[str]:
    """The live processes of `uid` started for `folder` (their environment names it: an
    `as_nobody` command's state folder), not zombies (a killed harness's child awaits its
    reaper); other processes of that user (another test session, a daemon) are not ours."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid \
                    and Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" \
                    and str(folder).encode() in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(f"{entry} {Path(f'/proc/{entry}/cmdline').read_bytes()[:120]!r}")
        except (OSError, IndexError):
            continue
    return found
