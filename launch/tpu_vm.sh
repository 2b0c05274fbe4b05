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
#   launch/tpu_vm.sh run CONFIG WORKDIR [ARGS]   # start training on every worker, in the background
#   launch/tpu_vm.sh logs [N]                    # the last N [40] lines of worker 0's training log
#   launch/tpu_vm.sh evaluate WORKDIR [ARGS]     # pass@k of WORKDIR's newest checkpoint, every worker
#                                                # sampling its share (launch.evaluate; ARGS e.g. --n 4)
#   launch/tpu_vm.sh delete                      # delete the slice
#
# `run` starts `python -m launch.train` under nohup on every worker and returns: the run goes on
# when the ssh session ends. Each worker writes ~/aepo-jax/logs/train-HOSTNAME.log (appended to by
# later runs); worker 0's holds the metrics lines (`logs`).
#
# Settings come from the environment (defaults in brackets):
#   TPU_NAME [aepo-jax], ZONE [us-east5-a],
#   ACCELERATOR_TYPE [v5p-64: 32 chips on 8 hosts, which hold both paper configs, docs/scaling.md;
#     with v5p-128 (16 hosts) the 14B config needs --config.train.mini_batch_prompts divisible by 16],
#   RUNTIME_VERSION [v2-alpha-tpuv5], PROJECT [gcloud default],
#   REPO_URL [required by create and install: the git URL every worker clones, e.g.
#     https://github.com/ORG/aepo-jax.git], BRANCH [main], PYTHON [python3; it must be >= 3.11: if the
#     runtime image's is older, install one on the workers (e.g. python3.11 and python3.11-venv) and
#     run `PYTHON=python3.11 launch/tpu_vm.sh install`],
#   START_CHECK_S [15: `run` waits this long and fails if a worker's training has already exited with an
#     error],
#   FORWARD_ENV [none: names of local environment variables whose values `run` and `evaluate` export on
#     every worker, e.g. FORWARD_ENV="JUDGE_API_KEY LIBTPU_INIT_ARGS XLA_FLAGS" (the judge's key is the
#     variable reward.judge_api_key_env names). They travel in a file copied to ~/.aepo-jax/ (mode 700)
#     on every worker, which the remote command loads and deletes: never on a command line, never
#     printed; a name that is not set here is refused]
# WORKDIR is an absolute path every worker mounts at the same place (a bucket through
# gcsfuse, e.g. /mnt/BUCKET/run, or a Filestore share): checkpoints must be
# visible to every host (orbax writes them collectively). A gs:// URL or a relative
# path (each worker's own folder under ~/aepo-jax) is refused.
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
REPO_URL="${REPO_URL:-}"
BRANCH="${BRANCH:-main}"
START_CHECK_S="${START_CHECK_S:-15}"
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

# `export NAME=VALUE; ` for each name of FORWARD_ENV, the values quoted for the workers' bash.
forwarded_env() {
  local name
  for name in ${FORWARD_ENV:-}; do
    if [[ ! "${name}" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      echo "error: FORWARD_ENV names '${name}', which is no environment variable name" >&2
      exit 2
    fi
    if [[ -z "${!name+set}" ]]; then
      echo "error: FORWARD_ENV names ${name}, which is not set here" >&2
      exit 2
    fi
    printf 'export %s=%q; ' "${name}" "${!name}"
  done
}

# Copy FORWARD_ENV's `export` lines to every worker; print the remote command that loads and deletes them.
# The values travel by scp into ~/.aepo-jax (mode 700), not inside the ssh command, where every `ps`
# listing on this machine showed them (the ssh command is gcloud's and ssh's argument).
forwarded_env_loader() {
  # Explicit exits: this runs in a command substitution, where `set -e` does not hold.
  local exports file name
  exports="$(forwarded_env)" || exit $?
  [[ -n "${exports}" ]] || return 0
  file="$(mktemp)"
  trap "rm -f $(printf '%q' "${file}")" EXIT  # expanded now: the local is gone when the subshell exits
  chmod 600 "${file}"
  printf '%s\n' "${exports}" > "${file}"
  name="forward-env.$(basename "${file}")"
  on_all_workers "mkdir -p ~/.aepo-jax && chmod 700 ~/.aepo-jax" > /dev/null || exit 1
  gcloud compute tpus tpu-vm scp "${file}" "${TPU_NAME}:.aepo-jax/${name}" --zone "${ZONE}" \
    "${PROJECT_FLAG[@]}" --worker=all > /dev/null || exit 1
  printf '. ~/.aepo-jax/%s || exit 1; rm -f ~/.aepo-jax/%s; ' "${name}" "${name}"
}

require_repo_url() {
  if [[ -z "${REPO_URL}" ]]; then
    echo "error: set REPO_URL to the git URL every worker clones (e.g." \
      "REPO_URL=https://github.com/ORG/aepo-jax.git launch/tpu_vm.sh $1)" >&2
    exit 2
  fi
}

require_absolute_workdir() {
  if [[ "$1" != /* ]]; then
    echo "error: WORKDIR '$1' must be an absolute path that every worker mounts at the same place" \
      "(e.g. /mnt/BUCKET/run, the bucket mounted on every worker): a relative path is each worker's own" \
      "folder under ~/aepo-jax" >&2
    exit 2
  fi
}

create() {
  require_repo_url create
  gcloud compute tpus tpu-vm create "${TPU_NAME}" --zone "${ZONE}" "${PROJECT_FLAG[@]}" \
    --accelerator-type "${ACCELERATOR_TYPE}" --version "${RUNTIME_VERSION}"
  install_package
}

install_package() {
  require_repo_url install
  # Same checkout and environment on every host.
  # The versions CI tests (constraints.txt), the tokenizer and tool extras the paper configs need
  # (hf: tokenizer.json; server: the search server and the tools), and a Python the code runs on.
  on_all_workers "set -e; ${PYTHON} -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
    \"aepo-jax needs Python >= 3.11; set PYTHON to one (e.g. PYTHON=python3.11)\")'; \
    rm -rf aepo-jax; git clone --branch $(printf '%q' "${BRANCH}") $(printf '%q' "${REPO_URL}") aepo-jax; \
    cd aepo-jax && ${PYTHON} -m venv .venv && .venv/bin/pip install -q -U pip && \
    .venv/bin/pip install -q -c constraints.txt -e '.[hf,server,tensorboard]' 'jax[tpu]'"
}

run() {
  [[ $# -ge 2 ]] || usage
  local config="$1" workdir="$2"
  shift 2
  require_absolute_workdir "${workdir}"
  local exports train remote
  exports="$(forwarded_env_loader)"
  # Every argument quoted (printf %q), so that it reaches every worker as one argument, spaces included.
  train="$(printf ' %q' .venv/bin/python -m launch.train --config "${config}" --workdir "${workdir}" \
    --config.distributed=on "$@")"
  # A worker that still runs an earlier training refuses a second one (both would claim its chips);
  # a training that fails within START_CHECK_S seconds (a bad setting) fails the command, with its log's end.
  remote="${exports}cd aepo-jax && mkdir -p logs || exit 1; log=logs/train-\$(hostname).log; "
  remote+="if [[ -f logs/train.pid ]] && kill -0 \$(cat logs/train.pid) 2>/dev/null; then "
  remote+="echo \"\$(hostname): a training started earlier still runs (pid \$(cat logs/train.pid))\" >&2; exit 1; fi; "
  remote+="nohup${train} >> \"\${log}\" 2>&1 < /dev/null & pid=\$!; echo \${pid} > logs/train.pid; "
  remote+="sleep $(printf '%q' "${START_CHECK_S}"); "
  remote+="if ! kill -0 \${pid} 2>/dev/null && ! wait \${pid}; then "
  remote+="echo \"\$(hostname): the training exited at once; the end of ~/aepo-jax/\${log}:\" >&2; "
  remote+="tail -n 20 \"\${log}\" >&2; exit 1; fi; "
  remote+="echo \"\$(hostname): training in the background, log ~/aepo-jax/\${log}\""
  on_all_workers "${remote}"
}

logs() {
  local lines="${1:-40}"
  [[ "${lines}" =~ ^[0-9]+$ ]] || usage
  gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone "${ZONE}" "${PROJECT_FLAG[@]}" \
    --worker=0 --command "tail -n ${lines} aepo-jax/logs/train-\$(hostname).log"
}

evaluate() {
  [[ $# -ge 1 ]] || usage
  local workdir="$1"
  shift 1
  # `none`: the base model's own evaluation (launch.evaluate --checkpoint none), no run directory.
  [[ "${workdir,,}" == none ]] || require_absolute_workdir "${workdir}"
  local exports
  exports="$(forwarded_env_loader)"
  on_all_workers "${exports}cd aepo-jax &&$(printf ' %q' .venv/bin/python -m launch.evaluate \
    --checkpoint "${workdir}" --distributed=on "$@")"
}

delete() {
  gcloud compute tpus tpu-vm delete "${TPU_NAME}" --zone "${ZONE}" "${PROJECT_FLAG[@]}" --quiet
}

case "${1:-}" in
  create) shift; create "$@" ;;
  install) shift; install_package "$@" ;;
  run) shift; run "$@" ;;
  logs) shift; logs "$@" ;;
  evaluate) shift; evaluate "$@" ;;
  delete) shift; delete "$@" ;;
  *) usage ;;
esac
