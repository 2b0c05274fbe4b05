#!/usr/bin/env bash
# Multi-host GPU launch: run this once on EVERY host, with the same arguments.
#
#   JAX_COORDINATOR_ADDRESS=10.0.0.1:12345 JAX_NUM_PROCESSES=4 JAX_PROCESS_ID=<0..3> \
#     launch/gpu_multi.sh CONFIG WORKDIR [--config.key=value ...]
#
# One node: JAX_COORDINATOR_ADDRESS=localhost:12345 JAX_NUM_PROCESSES=1 JAX_PROCESS_ID=0.
# Host 0's address is the coordinator. `maybe_initialize_distributed` reads the
# three variables and calls jax.distributed.initialize(); each process then
# drives all local GPUs (one process per host) and reads its own data shard.
# Under SLURM the variables may be left out: with SLURM_NTASKS > 1 JAX detects
# the cluster itself (`srun launch/gpu_multi.sh CONFIG WORKDIR`).
# WORKDIR must be on a filesystem shared by every host (checkpoints are
# written collectively by orbax).
# Attention backend: the paper configs default to model.attention=splash (TPU
# kernels); on GPUs pass --config.model.attention=cudnn (bfloat16 compute) or
# =dense (docs/attention.md, docs/scaling.md).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,18p' "$0" >&2
  exit 2
fi
CONFIG="$1"
WORKDIR="$2"
shift 2

if [[ -z "${SLURM_NTASKS:-}" ]]; then
  : "${JAX_COORDINATOR_ADDRESS:?set JAX_COORDINATOR_ADDRESS=host0:port (the same on every host)}"
  : "${JAX_NUM_PROCESSES:?set JAX_NUM_PROCESSES to the number of hosts}"
  : "${JAX_PROCESS_ID:?set JAX_PROCESS_ID to the index of this host (0 on the coordinator)}"
  export JAX_COORDINATOR_ADDRESS JAX_NUM_PROCESSES JAX_PROCESS_ID
fi

# Let XLA use the GPUs' memory for the model rather than pre-allocating 75%.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
# Every host needs the tested versions, the tokenizer and tool extras and a CUDA build of jax:
#   python -m pip install -c constraints.txt -e '.[hf,server,tensorboard]' 'jax[cuda12]'
PYTHON="${PYTHON:-python}"
# The repository this script is in, importable from any working directory (CONFIG and WORKDIR stay
# relative to the caller's).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${REPO}${PYTHONPATH:+:${PYTHONPATH}}"

exec "${PYTHON}" -m launch.train --config "${CONFIG}" --workdir "${WORKDIR}" \
  --config.distributed=on "$@"
