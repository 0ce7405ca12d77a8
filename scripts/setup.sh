#!/usr/bin/env bash
# scripts/setup.sh: installs what llm8 needs and is missing; idempotent. On a machine where everything is already
# present (e.g. a GPU box with no package registry) it only checks and does nothing.
#   build:  cmake, a C++17 compiler, the CUDA toolkit (nvcc, cuBLASLt), NCCL, nlohmann/json, CLI11, GoogleTest
#   python: numpy, tiktoken (data preparation), regex (tokenizer reference test); optional: safetensors, ml_dtypes
set -euo pipefail

say() { printf 'setup: %s\n' "$*"; }

have_header() {  # have_header <relative header path>
  local d
  for d in /usr/include /usr/local/include /usr/local/cuda/include /opt/conda/include "${CONDA_PREFIX:-/nonexistent}/include"; do
    [ -e "$d/$1" ] && return 0
  done
  return 1
}

apt_missing=()
command -v cmake >/dev/null 2>&1 || apt_missing+=(cmake)
command -v g++ >/dev/null 2>&1 || apt_missing+=(g++)
command -v make >/dev/null 2>&1 || apt_missing+=(make)
command -v python3 >/dev/null 2>&1 || apt_missing+=(python3 python3-pip)
have_header nlohmann/json.hpp || apt_missing+=(nlohmann-json3-dev)
have_header CLI/CLI.hpp || apt_missing+=(libcli11-dev)
have_header gtest/gtest.h || apt_missing+=(libgtest-dev)

if [ ${#apt_missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    say "installing Debian packages: ${apt_missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${apt_missing[@]}"
  else
    say "missing: ${apt_missing[*]} and no apt-get to install them; install them with your package manager"
    exit 1
  fi
else
  say "build dependencies present"
fi

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  say "the CUDA toolkit (nvcc, cuBLASLt, NCCL) is required: install CUDA 12.8+ (13.0 tested) and put nvcc on PATH"
  exit 1
fi

py_missing=()
for mod in numpy tiktoken regex; do
  python3 -c "import $mod" >/dev/null 2>&1 || py_missing+=("$mod")
done
if [ ${#py_missing[@]} -gt 0 ]; then
  say "installing Python packages: ${py_missing[*]}"
  if ! python3 -m pip install -q "${py_missing[@]}" 2>/dev/null; then
    python3 -m pip install -q --break-system-packages "${py_missing[@]}" ||
      { say "could not install ${py_missing[*]} with pip; data preparation needs numpy and tiktoken"; exit 1; }
  fi
else
  say "python packages present"
fi

# Optional Python packages: their tests are skipped (exit 77) without them, so a failed install is not an error.
#   ml_dtypes: the reference FP8 / bf16 casts that test/core/test_fp8_vectors.py regenerates the vectors with.
for mod in ml_dtypes; do
  if ! python3 -c "import $mod" >/dev/null 2>&1; then
    say "installing optional Python package: $mod"
    python3 -m pip install -q "$mod" 2>/dev/null || python3 -m pip install -q --break-system-packages "$mod" 2>/dev/null ||
      say "could not install $mod (optional: the tests that need it are skipped)"
  fi
done
