#!/usr/bin/env bash
# Wheels the lent GPU machine lacks (it reaches no network), fetched here into .whl/ (ignored
# by git; carry it with the device tool's `carry: [".whl"]`):
#   .whl/     pydantic and its needs (bench/ and the runtime's contracts import pydantic), and
#             httpx and its needs (tests/conftest.py imports it: `pytest -m gpu` there)
#   .whl/ds/  DeepSpeed, built here from PyPI's source distribution without its C++ ops (it
#             JIT-builds CPU Adam on first use), and its needs, for the deepspeed-zero3-offload
#             row of bench/runtime.py
# On the GPU machine (Python 3.12):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .whl/ds/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
fetch() {  # wheels for the GPU machine's CPython 3.12 on x86-64 Linux
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$@"
}
mkdir -p .whl/ds
fetch .whl pydantic==2.13.4 pydantic_core==2.46.4 annotated_types typing_inspection \
  typing_extensions
fetch .whl httpx httpcore h11 anyio sniffio idna certifi  # tests/conftest.py, for pytest -m gpu
fetch .whl/ds einops hjson msgpack ninja psutil py-cpuinfo nvidia-ml-py
if ! ls .whl/ds/deepspeed-*.whl >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --no-binary=:all: deepspeed==0.19.8 -d "$tmp"
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation "$tmp"/deepspeed-*.tar.gz \
    -w .whl/ds
  rm -rf "$tmp"
fi
ls -l .whl .whl/ds
