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
# Under SLURM the variables may be left out in a task of an srun step (SLURM_PROCID
# set): JAX detects the cluster itself. Run one task per node, with the node's GPUs:
#   srun -N4 --ntasks-per-node=1 --gpus-per-node=8 launch/gpu_multi.sh CONFIG WORKDIR
# (the process takes the GPUs CUDA_VISIBLE_DEVICES lists, `slurm_local_device_ids`).
# WORKDIR must be on a filesystem shared by every host (checkpoints are
# written collectively by orbax).
# Attention backend: the paper configs default to model.attention=splash (TPU
# kernels); on GPUs pass --config.model.attention=cudnn (bfloat16 compute) or
# =dense (docs/attention.md, docs/scaling.md).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2  # the header comment
  exit 2
fi
CONFIG="$1"
WORKDIR="$2"
shift 2

# A task of an srun step names itself (SLURM_PROCID); a shell inside salloc sees SLURM_NTASKS but is no task.
if [[ -z "${SLURM_PROCID:-}" ]]; then
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
