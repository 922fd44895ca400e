#!/usr/bin/env bash
# Installs what libddp needs on a fresh Debian 12 machine, skipping what is there.
#   setup_debian.sh            Debian's LibTorch 1.13 (CPU) with Gloo, and the build tools
#   setup_debian.sh --cuda     also LibTorch 2.x with CUDA from PyPI (`python3 -m pip install torch`) and
#                              cudnn-frontend's headers (nvidia-cudnn-frontend, for the FP8 attention benchmark)
set -euo pipefail

packages=(cmake ninja-build g++ ccache libtorch-dev libgloo-dev libfmt-dev libgtest-dev libjpeg-dev python3 doxygen)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [[ "${1:-}" == "--cuda" ]] && ! python3 -c 'import torch' 2>/dev/null; then
  echo "setup: installing torch (CUDA) for python3 from PyPI"
  python3 -m pip install --quiet torch
fi
if [[ "${1:-}" == "--cuda" ]]; then
  frontend_header=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/include/cudnn_frontend.h
  if [[ ! -e "$frontend_header" ]]; then
    echo "setup: installing cudnn-frontend's headers for python3 from PyPI"
    python3 -m pip install --quiet nvidia-cudnn-frontend
  fi
fi
