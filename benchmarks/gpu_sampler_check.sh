#!/usr/bin/env bash
# Our sampler vs tunix's on one GPU, side by side in one run: a ~0.5B Qwen3-shaped model in bf16,
# batch 64, prompt 16, 512 new tokens (issue 15's GPU check), its decode profile (kernels per step),
# the CPU bar shape at batch 32, and the sampler and model tests. About 8 minutes on an H200, so
# give the device call a timeout near 600 s; the later steps are skipped when time runs short.
#
#   benchmarks/gpu_sampler_check.sh OUT_DIR [WHEEL_DIR]
#
# Runs from the repository root with the machine's own python3 and jax (no installs from an index).
# WHEEL_DIR (default .whl) holds, as wheels: google-tunix and the packages it imports that the machine
# lacks (clu, google-metrax, perfetto, tensorboardX), flax at the version the project pins,
# ml_collections (the tests' configs), and a copy
# of ../shared/bench/tunix_sampler_bench.py (the peer's driver). Both sides get the pinned flax; if our
# smoke run fails with it, ours falls back to the machine's flax, and likewise the peer (the log says
# which ran). Each step writes its log and JSON into OUT_DIR as it ends, so a step that runs out of
# time keeps what the earlier steps measured.
set -uo pipefail
out=${1:?usage: gpu_sampler_check.sh OUT_DIR [WHEEL_DIR]}
wheels=${2:-.whl}
mkdir -p "$out"
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
# Seconds left of TOTAL_S (default 570, inside a 600 s device call), at most $1: a step's own timeout.
left() { local rest=$(( ${TOTAL_S:-570} - $(elapsed) )); echo $(( rest < $1 ? (rest > 1 ? rest : 1) : $1 )); }

# Two processes share the GPU (ours and the peer's subprocess): neither may take most of it.
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  python3 -c "import jax, flax; print('image: jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
} 2>&1 | tee "$out/machine.txt"

pinned=/tmp/pinned-site peer_site=/tmp/peer-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$pinned" "$wheels"/flax-*.whl \
  "$wheels"/ml_collections-*.whl || { echo "could not install the pinned flax"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$peer_site" "$wheels"/*.whl \
  || { echo "could not install the peer's wheels"; exit 1; }
# tunix and the packages it needs, without flax: the decode profile runs both samplers in one process,
# on our side's flax (if that is not one the peer accepts, the profile's tunix part fails, not ours).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/peer-deps \
  $(ls "$wheels"/*.whl | grep -v -e /flax- -e /ml_collections-) || { echo "could not install the peer's wheels"; exit 1; }
driver="$wheels/tunix_sampler_bench.py"
[ -f "$driver" ] || { echo "no peer driver at $driver"; exit 1; }

smoke_ours() { PYTHONPATH="$1" python3 -m benchmarks.sampler_bench --layers 2 --d-model 64 --vocab 256 --batch 4 \
  --new-tokens 8 --prompt-len 4 --iters 1 --warmup 0 --peak-size 1024 >>"$out/smoke.log" 2>&1; }
smoke_peer() { PYTHONPATH="$1" python3 "$driver" --batch 2 --new-tokens 4 --layers 1 --d-model 64 --vocab 256 \
  --iters 1 --warmup 1 >>"$out/smoke.log" 2>&1; }

ours_path=$pinned
if ! smoke_ours "$pinned"; then
  echo "ours failed with the pinned flax; trying the image's flax" | tee -a "$out/smoke.log"
  ours_path=""
  smoke_ours "" || { echo "ours failed with either flax: see smoke.log"; tail -40 "$out/smoke.log"; exit 1; }
fi
peer_path=$peer_site
if ! smoke_peer "$peer_site"; then
  echo "the peer failed with the pinned flax; trying the image's flax" | tee -a "$out/smoke.log"
  peer_path=/tmp/peer-deps
  smoke_peer "$peer_path" || { echo "the peer failed with either flax: see smoke.log"; tail -40 "$out/smoke.log"; exit 1; }
fi
printf '#!/bin/sh\nPYTHONPATH=%s exec python3 "$@"\n' "$peer_path" >/tmp/peer-python && chmod +x /tmp/peer-python
echo "smoke runs passed at $(elapsed) s (ours flax from '${ours_path:-image}', peer from '$peer_path')" | tee -a "$out/machine.txt"

bench() {  # bench NAME ARGS...: one side-by-side sampler_bench run against tunix
  local name=$1; shift
  echo "== $name at $(elapsed) s"
  PYTHONPATH="$ours_path" python3 -m benchmarks.sampler_bench "$@" --peer tunix --peer-python /tmp/peer-python \
    --peer-script "$driver" --json "$out/$name.json" 2>&1 | tee "$out/$name.log"
}
# MAIN_SHAPE and BAR_SHAPE override the shapes, TEST_PLATFORM the tests' JAX platform (cuda): a tiny rehearsal
# of this script on a CPU, say.
# shellcheck disable=SC2086
bench sampler_0p5b_bf16 ${MAIN_SHAPE:---layers 24 --d-model 1024 --heads 16 --kv-heads 8 --vocab 151936 \
  --batch 64 --prompt-len 16 --new-tokens 512 --dtype bfloat16} --mode sample --rounds 2 --iters 5
# Where the step's device time goes, ours (layerwise and stacked windows) and tunix's, from profiler traces.
if [ "$(elapsed)" -lt "${PROFILE_DEADLINE_S:-250}" ]; then
  echo "== decode profile at $(elapsed) s"
  # shellcheck disable=SC2086
  PYTHONPATH="${ours_path:+$ours_path:}/tmp/peer-deps" python3 -m benchmarks.decode_profile ${MAIN_SHAPE:---layers 24 \
    --d-model 1024 --heads 16 --kv-heads 8 --vocab 151936 --batch 64 --prompt-len 16 --new-tokens 512 \
    --dtype bfloat16} --iters 2 --variants layerwise,stacked --peer-script "$driver" --trace-dir /tmp/traces \
    --json "$out/decode_profile.json" 2>&1 | tee "$out/decode_profile.log" | grep --line-buffered -v Warning
else
  echo "skipped the decode profile: $(elapsed) s gone"
fi
if [ "$(elapsed)" -lt "${BAR_SHAPE_DEADLINE_S:-400}" ]; then
  # shellcheck disable=SC2086
  bench sampler_bar_b32_f32 ${BAR_SHAPE:---layers 4 --d-model 256 --vocab 4096 --batch 32 --new-tokens 128 \
    --prompt-len 16} --mode sample --rounds 2 --iters 5
else
  echo "skipped the bar shape: $(elapsed) s gone"
fi
# The sampler and model tests on the GPU (they default to the CPU): the same code, unchanged, on this
# backend. Tests built for 8 fake CPU devices cannot run on one GPU; the log names each failure.
if [ "$(elapsed)" -lt "${TESTS_DEADLINE_S:-460}" ]; then
  echo "== sampler and model tests on $(python3 -c 'import jax; print(jax.default_backend())') at $(elapsed) s"
  # The layerwise tests first and alone (the GPU's default decode, its float32 -> compute-dtype copy), then
  # the rest of the sampler and model tests with whatever time is left. float32 products at full precision
  # (XLA:GPU may run them as TF32), since the tests compare float32 results at CPU tolerances.
  export PYTHONPATH="$ours_path" JAX_PLATFORMS="${TEST_PLATFORM:-cuda}" XLA_PYTHON_CLIENT_PREALLOCATE=false \
    JAX_DEFAULT_MATMUL_PRECISION=highest \
    JAX_ENABLE_COMPILATION_CACHE=false XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=3"
  timeout "$(left "${LAYERWISE_TESTS_TIMEOUT_S:-90}")" python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/sampling/test_sampler_layerwise.py 2>&1 | tee "$out/gpu_layerwise_tests.log" | tail -15
  # -v: each result is logged as it comes (with its test's name), so a run the timeout cuts still says which failed.
  timeout "$(left "${TESTS_TIMEOUT_S:-120}")" python3 -m pytest -v -n 4 -p no:cacheprovider -rfE tests/sampling tests/models \
    --ignore=tests/sampling/test_sampler_layerwise.py 2>&1 | tee "$out/gpu_tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -40
else
  echo "skipped the tests: $(elapsed) s gone"
fi
echo "done at $(elapsed) s"
