"""`chaos doctor`'s part of the fault library: what this machine can do (chaos.probe) and
which mechanism each fault kind gets here (chaos.inject). Above both; neither imports it.

    python -m chaos.doctor
"""
from __future__ import annotations

import argparse
import sys

from chaos.faults import Slow
from chaos.inject import choose_mechanisms
from chaos.probe import CHECKS, capabilities


def doctor_command(args: argparse.Namespace) -> int:
    """`chaos doctor`: print what this machine can do and which mechanism each fault kind uses."""
    caps = capabilities()
    print(f"capabilities (probed in {caps.seconds * 1000:.0f} ms):")
    for check in CHECKS:
        ok = getattr(caps, check)
        print(f"  {check:17} {'yes' if ok else 'no  (' + caps.why_not(check) + ')'}")
    print(f"  {'nft families':17} {', '.join(caps.nft_families) or 'none'}")
    print("fault kinds:")
    for kind, mech in choose_mechanisms(caps).items():
        print(f"  {kind:10} {mech.name}")
        if kind == "slow":  # its GPU settings have a way of their own
            print(f"  {'':10} gpu_clock, power_limit: {mech.for_fault(Slow(gpu_clock=1)).name}")
    return 0


def doctor_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos doctor", description=doctor_command.__doc__)
    return doctor_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(doctor_main())
