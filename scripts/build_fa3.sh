#!/usr/bin/env bash
# FlashAttention-3's Hopper kernels (Dao-AILab/flash-attention, hopper/) built from their own
# sources with only the variants wstrain calls: bf16, head dim 128, causal and non-causal,
# forward and backward, varlen (packed documents), sm90a. Everything else is switched off with
# the build's own FLASH_ATTENTION_DISABLE_* flags, which cuts the instantiations from ~450 to 3.
# The sources stay an external dependency: this script fetches nothing into the repository.
#
#   bash scripts/build_fa3.sh pack FA_REPO CUTLASS_REPO   # here: build/fa3-src.tar.gz from two
#                                                         # git clones at the pinned commits
#   bash scripts/build_fa3.sh build OUT_DIR               # on the GPU host (nvcc >= 12.3):
#                                                         # unpack, build, wheel into OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
# hopper/ at this commit; CUTLASS at the commit flash-attention pins as its csrc/cutlass submodule
FA_COMMIT=0251105a
CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671
TARBALL=build/fa3-src.tar.gz

case "${1:-}" in
pack)
  fa="$2"; cutlass="$3"; tmp=$(mktemp -d)
  mkdir -p "$tmp/flash-attention/csrc/cutlass" build
  git -C "$fa" archive "$FA_COMMIT" hopper README.md | tar -x -C "$tmp/flash-attention"  # setup.py reads ../README.md
  git -C "$cutlass" archive "$CUTLASS_COMMIT" include | tar -x -C "$tmp/flash-attention/csrc/cutlass"
  tar -czf "$TARBALL" -C "$tmp" flash-attention
  rm -rf "$tmp"; ls -l "$TARBALL" ;;
build)
  out="$2"; src=/tmp/fa3; rm -rf "$src"; mkdir -p "$src" "$out"
  tar -xzf "$TARBALL" -C "$src"
  for f in SPLIT PAGEDKV APPENDKV LOCAL SOFTCAP PACKGQA FP16 FP8 CLUSTER HDIM64 HDIM96 HDIM192 \
           HDIM256 SM80 HDIMDIFF64 HDIMDIFF192; do
    export "FLASH_ATTENTION_DISABLE_$f=TRUE"
  done
  export FLASH_ATTENTION_OFFLINE_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS:-16}" NVCC_THREADS="${NVCC_THREADS:-4}"
  export TORCH_CUDA_ARCH_LIST=9.0a
  cd "$src/flash-attention/hopper"
  python3 -m pip wheel --no-build-isolation --no-deps -w "$out" . ;;
*) sed -n '2,11p' "$0"; exit 2 ;;
esac
