#!/usr/bin/env bash
# quantized_bench.py on the lent GPU host (no internet there, 64 MiB carried per call), without
# the service: NVIDIA ModelOpt and what it and the project's quantize / hf-engine path import
# beyond the host's image travel as wheels, at the versions the project's .venv holds (about
# 24 MiB; pulp alone 16 MiB). They go into the image's own environment with --no-deps, so its
# numpy 2 and the scipy built for it, which ModelOpt imports, stay as they are.
#
#   here (after scripts/bootstrap.sh):  benchmarks/quantized_gpu_host.sh wheels .gpuhost-quant
#   on the host (carry .gpuhost-quant): bash benchmarks/quantized_gpu_host.sh run .gpuhost-quant \
#                                         --demo-size 1b --out "$OUT"/quantized
set -euo pipefail
mode=${1:?usage: quantized_gpu_host.sh wheels|run DIR [quantized_bench.py arguments]}
dir=${2:?usage: quantized_gpu_host.sh wheels|run DIR [quantized_bench.py arguments]}
shift 2
# ModelOpt (requirements-modelopt.txt), what it imports that the image lacks (requirements-dev.txt
# names the rest), and what the project's modules on the way import (packing/engine_packing.py:
# tritonclient; cpu_engine/block_cache.py: pyzmq; common/quantization.py: pydantic).
PACKAGES="nvidia-modelopt omegaconf pulp pydantic pydantic-core annotated-types typing-inspection
tritonclient python-rapidjson pyzmq"

case "$mode" in
wheels)
  mkdir -p "$dir/wheels"
  pins=$(.venv/bin/python -m pip freeze | python3 -c '
import re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n.strip().lower())
want = {norm(n) for n in sys.argv[1].split()}
pins = [line.strip() for line in sys.stdin if norm(line.partition("==")[0]) in want]
missing = want - {norm(p.partition("==")[0]) for p in pins}
if missing:
    sys.exit(f"not in .venv: {sorted(missing)} (run scripts/bootstrap.sh)")
print(" ".join(pins))
' "$PACKAGES")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$dir/wheels" $pins
  du -sh "$dir/wheels"
  ;;
run)
  echo "== machine"; nvidia-smi -L; echo "nproc: $(nproc)"; python3 --version
  python3 -c 'import numpy, torch, transformers
print("image: numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$dir"/wheels/*.whl; then
    echo "installed into the environment"
  else
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      "$dir"/wheels/*.whl
    export PYTHONPATH=/tmp/site; echo "installed into /tmp/site"
  fi
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  echo "== quantized_bench.py $* at ${SECONDS}s"
  set +e
  timeout -s TERM "${BENCH_TIMEOUT:-520}" python3 benchmarks/quantized_bench.py "$@"
  echo "rc=$? at ${SECONDS}s"
  ;;
*)
  echo "usage: quantized_gpu_host.sh wheels|run DIR [quantized_bench.py arguments]" >&2; exit 2 ;;
esac
