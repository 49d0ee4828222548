"""Configured vs measured for every fault mechanism this machine uses (needs root).

    .venv/bin/python bench/calibrate_faults.py

The same as `chaos calibrate`; see chaos/calibrate.py for the targets and the method.
"""
import sys

from chaos.calibrate import calibrate_main

if __name__ == "__main__":
    sys.exit(calibrate_main(sys.argv[1:]))
