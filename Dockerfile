# The rank image for GPU nodes: a real PyTorch base image (CUDA + NCCL) plus this project.
#
#   docker build -t chaos-harness:gpu .          (or `docker compose build`)
#
# TORCH_IMAGE must carry the torch version pinned in pyproject.toml (torch==2.13.0), so
# that pip keeps the base image's CUDA build instead of fetching another one.
# The CI machine has no registry: it never builds this file; the docker backend imports a
# tiny local image there and bind-mounts the host's Python environment instead.
ARG TORCH_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
FROM ${TORCH_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    OMP_NUM_THREADS=1

# iproute2: look at links and qdiscs from inside a rank while debugging a fault.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/chaos-harness
COPY pyproject.toml ./
COPY chaos ./chaos
COPY harness ./harness
COPY reports ./reports
# The torch of the base image satisfies the pin; fail the build rather than download another.
RUN python -c "import torch, sys; v = torch.__version__.split('+')[0]; \
sys.exit(0 if v == '2.13.0' else f'base image has torch {v}, pyproject pins 2.13.0: set TORCH_IMAGE')" \
 && pip install --no-deps . \
 && pip install "pyroute2>=0.9,<0.10" "pydantic>=2.7" "pyyaml>=6" "pandas>=2.2" "matplotlib>=3.8" \
    "nvidia-ml-py>=12" \
 && python -c "import harness.job.rank, harness.cluster.container"

# The run folder (events.jsonl, logs, checkpoints) is a volume shared by every rank.
VOLUME ["/runs"]
STOPSIGNAL SIGTERM
CMD ["python", "-m", "harness.cluster.container", "rank"]
