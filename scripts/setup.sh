#!/usr/bin/env bash
# Installs the Debian 12 packages vitlens needs to build, run and test. Idempotent: installs only
# what is missing. Run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libeigen3-dev libopencv-dev nlohmann-json3-dev libcli11-dev catch2   # core, models, CLI, tests
  zlib1g-dev                                                           # gzip'd training data (idx_reader.cpp)
  libimgui-dev libglfw3-dev libgl-dev                                  # the desktop viewer
  xvfb xauth xdotool                                                   # viewer tests on a virtual display, real input
  clang-14 libclang-rt-14-dev llvm-14                                  # ASan + UBSan build, libFuzzer, symbolized reports
  libdnnl-dev ocl-icd-opencl-dev                                       # oneDNN (its CMake config needs OpenCL), for bench/dnnl_linear.cpp only
  python3 python3-numpy                                                # fixture checks
  dataset-fashion-mnist opencv-doc                                     # data the tests read in place: training set, photos
)
# Only the scripts that regenerate reference data need PyTorch; pass --with-torch to get it.
if [[ "${1:-}" == "--with-torch" ]]; then PACKAGES+=(python3-torch); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
