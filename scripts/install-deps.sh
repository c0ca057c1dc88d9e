#!/usr/bin/env bash
# Installs flowstate's build and test dependencies from Debian's repositories.
# Idempotent: packages already present are not touched. Runs apt-get directly as root,
# through sudo otherwise. The Python package and its tests need pybind11, python3-dev,
# pytest, numpy and python3-torch (and mypy, which checks that a type checker reads the
# package's stubs); LibTorch tests the DLPack export; PIL and torchvision check and compare
# the image decode (tests/python/test_images.py, bench/). These are also the side-by-side
# comparison tools, so FLOWSTATE_DEPS_BENCH=1 (still accepted) adds nothing.
set -euo pipefail

pkgs=(build-essential cmake pkg-config git
      libtbb-dev libcereal-dev libyaml-cpp-dev nlohmann-json3-dev
      libxxhash-dev libsimdjson-dev libdlpack-dev libgtest-dev libgmock-dev libbenchmark-dev
      libsentencepiece-dev sentencepiece python3-sentencepiece libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
      clang libclang-rt-14-dev libfuzzer-14-dev clang-format
      openmpi-bin libopenmpi-dev
      pybind11-dev python3-dev python3-pytest python3-numpy python3-torch python3-venv
      python3-pip python3-setuptools python3-mypy libtorch-dev
      python3-pil python3-torchvision)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
echo "install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
