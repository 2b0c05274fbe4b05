#!/usr/bin/env bash
# Create, run on, and delete a Cloud TPU VM slice for aepo-jax training.
#
# Every host of a slice runs the same `python -m launch.train` command; JAX's
# TPU cluster detection (TPU_WORKER_HOSTNAMES, set by the TPU runtime) makes
# `maybe_initialize_distributed` call jax.distributed.initialize() on each host,
# and the data pipeline feeds each host its own shard (process_index).
#
# Usage:
#   launch/tpu_vm.sh create                      # create the slice, install the package on all workers
#   launch/tpu_vm.sh install                     # (re)install on every worker of an existing slice
#   launch/tpu_vm.sh run CONFIG WORKDIR [ARGS]   # same command on every worker
#   launch/tpu_vm.sh evaluate WORKDIR [ARGS]     # pass@k of WORKDIR's newest checkpoint, every worker
#                                                # sampling its share (launch.evaluate; ARGS e.g. --n 4)
#   launch/tpu_vm.sh delete                      # delete the slice
#
# Settings come from the environment (defaults in brackets):
#   TPU_NAME [aepo-jax], ZONE [us-east5-a],
#   ACCELERATOR_TYPE [v5p-64: 32 chips on 8 hosts, which hold both paper configs, docs/scaling.md;
#     with v5p-128 (16 hosts) the 14B config needs --config.train.mini_batch_prompts divisible by 16],
#   RUNTIME_VERSION [v2-alpha-tpuv5], PROJECT [gcloud default],
#   REPO_URL [git URL of this repository], BRANCH [main], PYTHON [python3; it must be >= 3.11: if the
#     runtime image's is older, install one on the workers (e.g. python3.11 and python3.11-venv) and
#     run `PYTHON=python3.11 launch/tpu_vm.sh install`]
# WORKDIR is a path every worker mounts at the same place (a bucket through
# gcsfuse, e.g. /mnt/BUCKET/run, or a Filestore share): checkpoints must be
# visible to every host (orbax writes them collectively). A gs:// URL is refused.
# tfds finishes its writes by renaming folders: mount the bucket with
# `gcsfuse --rename-dir-limit=1000000 BUCKET /mnt/BUCKET` (or use a bucket with a
# hierarchical namespace), or gcsfuse refuses those renames. Checkpoints are
# written in place and committed by a commit_success.txt (no rename).
# The paper configs run attention through the TPU kernels (model.attention=splash,
# docs/attention.md); nothing to override here.
set -euo pipefail

TPU_NAME="${TPU_NAME:-aepo-jax}"
ZONE="${ZONE:-us-east5-a}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v5p-64}"
PYTHON="${PYTHON:-python3}"
RUNTIME_VERSION="${RUNTIME_VERSION:-v2-alpha-tpuv5}"
REPO_URL="${REPO_URL:-https://github.com/your-org/aepo-jax.git}"
BRANCH="${BRANCH:-main}"
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then
  PROJECT_FLAG=(--project "${PROJECT}")
fi

usage() {
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2  # the header comment
  exit 2
}

# Run one shell command on every worker of the slice, in parallel.
on_all_workers() {
  gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone "${ZONE}" "${PROJECT_FLAG[@]}" \
    --worker=all --command "$1"
}

create() {
  gcloud compute tpus tpu-vm create "${TPU_NAME}" --zone "${ZONE}" "${PROJECT_FLAG[@]}" \
    --accelerator-type "${ACCELERATOR_TYPE}" --version "${RUNTIME_VERSION}"
  install_package
}

install_package() {
  # Same checkout and environment on every host.
  # The versions CI tests (constraints.txt), the tokenizer and tool extras the paper configs need
  # (hf: tokenizer.json; server: the search server and the tools), and a Python the code runs on.
  on_all_workers "set -e; ${PYTHON} -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
    \"aepo-jax needs Python >= 3.11; set PYTHON to one (e.g. PYTHON=python3.11)\")'; \
    rm -rf aepo-jax; git clone --branch ${BRANCH} ${REPO_URL} aepo-jax; \
    cd aepo-jax && ${PYTHON} -m venv .venv && .venv/bin/pip install -q -U pip && \
    .venv/bin/pip install -q -c constraints.txt -e '.[hf,server,tensorboard]' 'jax[tpu]'"
}

run() {
  [[ $# -ge 2 ]] || usage
  local config="$1" workdir="$2"
  shift 2
  # Quote the extra arguments so that they reach every worker unchanged.
  local extra=""
  if [[ $# -gt 0 ]]; then
    extra="$(printf ' %q' "$@")"
  fi
  on_all_workers "cd aepo-jax && .venv/bin/python -m launch.train --config ${config} \
    --workdir ${workdir} --config.distributed=on${extra}"
}

evaluate() {
  [[ $# -ge 1 ]] || usage
  local workdir="$1"
  shift 1
  local extra=""
  if [[ $# -gt 0 ]]; then
    extra="$(printf ' %q' "$@")"
  fi
  on_all_workers "cd aepo-jax && .venv/bin/python -m launch.evaluate --checkpoint ${workdir} \
    --distributed=on${extra}"
}

delete() {
  gcloud compute tpus tpu-vm delete "${TPU_NAME}" --zone "${ZONE}" "${PROJECT_FLAG[@]}" --quiet
}

case "${1:-}" in
  create) shift; create "$@" ;;
  install) shift; install_package "$@" ;;
  run) shift; run "$@" ;;
  evaluate) shift; evaluate "$@" ;;
  delete) shift; delete "$@" ;;
  *) usage ;;
esac
