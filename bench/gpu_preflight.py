"""The preflight of bench/gpu_check.sh: what this machine gives the check, one line per
item (works or not, and why), and the same as JSON in OUT_DIR/preflight.json.

    python bench/gpu_preflight.py OUT_DIR

Items: the Python and its torch (version, CUDA build, devices, NCCL), the GPUs as NVML
lists them (model, memory, driver), the kernel (gVisor reports 4.4.0), the user, each
backend of the harness (harness.cluster.backends: why it cannot run here, if it cannot),
and with root where namespaces work the kernel mechanisms (chaos.probe: veth, tc, netem,
tbf, nftables, BPF, NFQUEUE), and py-spy. Nothing here fails the check: a missing item
is a line that says so, and the parts that need it are skipped by the script.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

found: dict[str, dict[str, Any]] = {}


def item(name: str, ok: bool, detail: str) -> None:
    found[name] = {"ok": ok, "detail": detail}
    print(f"  {name:16} {'yes' if ok else 'no '}  {detail}", flush=True)


def torch_items() -> None:
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # noqa: BLE001  (whatever the import raises is the answer)
        item("torch", False, f"cannot import torch: {exc}")
        return
    item("torch", True, f"{torch.__version__} at {Path(torch.__file__).parent}")
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    item("cuda", cuda, f"build {torch.version.cuda or 'none (a CPU build)'}; {count} device(s) visible to torch")
    nccl = None
    if dist.is_nccl_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001
            nccl = f"unknown ({exc})"
    item("nccl", nccl is not None and cuda, f"{nccl or 'not built in'}; "
         f"{'a NCCL group needs 2 GPUs, ' + str(count) + ' here' if count < 2 else str(count) + ' GPUs'}")
    item("gloo", dist.is_gloo_available(), "the CPU collectives (and gloo on CUDA tensors)")


def nvml_items() -> None:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        item("nvml", False, f"NVML did not start: {exc}")
        return
    names = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        names.append(f"{pynvml.nvmlDeviceGetName(handle)} ({memory:.0f} GiB)")
    item("nvml", bool(names), f"{len(names)} GPU(s): {', '.join(names) or 'none'}; "
         f"driver {pynvml.nvmlSystemGetDriverVersion()}")


def harness_items() -> None:
    from harness.cluster.backends import BACKEND_NAMES, backend_class
    for name in BACKEND_NAMES:
        backend = backend_class(name)
        why = backend.why_not_here()
        item(f"backend {name}", why is None, why or backend.traits.summary)
    if os.geteuid() == 0:  # root, or root of a user namespace of its own
        from chaos.probe import CHECKS, capabilities
        caps = capabilities()
        for check in CHECKS:
            ok = bool(getattr(caps, check))
            item(check, ok, "works" if ok else caps.why_not(check))
    try:
        version = subprocess.run(["py-spy", "--version"], capture_output=True, text=True, timeout=10)
        item("py-spy", version.returncode == 0, version.stdout.strip() or version.stderr.strip())
    except (OSError, subprocess.TimeoutExpired) as exc:
        item("py-spy", False, f"cannot run py-spy: {exc}")


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    out.mkdir(parents=True, exist_ok=True)
    from chaos import userns
    from chaos.errors import UsageError
    from harness.cluster.backends import require_privileges
    try:  # an ordinary user: as root of a user namespace of its own where allowed, as `chaos run` would be
        require_privileges("gpu_check preflight")
    except UsageError:
        pass
    print("gpu_check preflight:")
    item("python", True, f"{platform.python_version()} at {sys.executable}")
    item("kernel", True, f"{platform.release()} ({'gVisor' if platform.release() == '4.4.0' else 'Linux'})")
    item("user", True, userns.who())
    torch_items()
    nvml_items()
    harness_items()
    (out / "preflight.json").write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
