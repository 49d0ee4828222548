#!/usr/bin/env bash
# Install libfuse 3 and fusermount3 (Debian's fuse3) if missing, and open /dev/fuse to every
# user as udev does: the FUSE storage faults
# (io_error, io_delay, io_stall: chaos.fusefs) mount a passthrough filesystem through them,
# by mfusepy (installed with the test extra). Exit codes: 0 installed; 1 it could not be.
set -euo pipefail
# An ordinary user's FUSE faults (in its user namespace) open /dev/fuse: udev makes it 666 on
# the distributions (systemd's 50-udev-default.rules); a machine without udev may have 600.
open_dev_fuse() {
    if [ -e /dev/fuse ] && [ "$(id -u)" = 0 ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
        echo "fuse: /dev/fuse is mode $(stat -c %a /dev/fuse): made 666, as udev does" >&2
        chmod 666 /dev/fuse
    fi
}
if command -v fusermount3 >/dev/null 2>&1 && ldconfig -p | grep -q 'libfuse3\.so'; then
    open_dev_fuse
    exit 0
fi
if [ "$(id -u)" != 0 ]; then echo "fuse: fuse3 missing and not root: cannot install" >&2; exit 1; fi
echo "fuse: installing fuse3 and libfuse3-3 (Debian's packages)" >&2
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fuse3 libfuse3-3 >/dev/null
open_dev_fuse
