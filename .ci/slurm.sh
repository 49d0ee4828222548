#!/usr/bin/env bash
# Install Debian's Slurm (slurm-wlm: slurmctld, slurmd, the client commands) and munge if
# missing, for the slurm backend's tests; `chaos slurm up` starts the daemons itself.
# The packages' own services are kept from starting (policy-rc.d): the tests' clusters
# bring their own munged and slurm.conf. Exit codes: 0 installed; 1 it could not be.
set -euo pipefail
say() { echo "slurm: $*" >&2; }
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
        && command -v munged >/dev/null 2>&1 && command -v srun >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then say "slurm-wlm missing and not root: cannot install"; exit 1; fi
say "installing slurm-wlm and munge (Debian's packages)"
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
