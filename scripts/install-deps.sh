#!/usr/bin/env bash
# Installs flowstate's build and test dependencies from Debian's repositories.
# Idempotent: packages already present are not touched. Runs apt-get directly as root,
# through sudo otherwise. The Python package and its tests need pybind11, python3-dev,
# pytest, numpy and python3-torch (and mypy, which checks that a type checker reads the
# package's stubs); LibTorch tests the DLPack export; PIL and torchvision check and compare
# the image decode (tests/python/test_images.py, bench/). These are also the side-by-side
# comparison tools, so FLOWSTATE_DEPS_BENCH=1 (still accepted) adds nothing.
# Remote sources (s3://, http(s)://) build against libcurl's headers and open libcurl when
# first used (nodes/sources/curl_loader.cpp); their tests start nginx-light (HTTP and
# HTTPS, a certificate made by openssl at test time), upload with boto3, and run the S3
# server s3rver from npm, pinned by tests/support/s3/package-lock.json and installed there
# with `npm ci` (below, also when every Debian package is present).
set -euo pipefail

pkgs=(build-essential cmake pkg-config git
      libtbb-dev libcereal-dev libyaml-cpp-dev nlohmann-json3-dev
      libxxhash-dev libsimdjson-dev libdlpack-dev libgtest-dev libgmock-dev libbenchmark-dev
      libsentencepiece-dev sentencepiece python3-sentencepiece libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
      clang libclang-rt-14-dev libfuzzer-14-dev clang-format
      openmpi-bin libopenmpi-dev
      pybind11-dev python3-dev python3-pytest python3-numpy python3-torch python3-venv
      python3-pip python3-setuptools python3-mypy libtorch-dev
      python3-pil python3-torchvision
      libcurl4-openssl-dev nginx-light openssl python3-boto3 nodejs)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# Debian's nodejs comes without npm (its own package); NodeSource's nodejs carries it.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
else
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  echo "install-deps: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The test S3 server, at the version the lockfile pins (skipped when already installed so).
s3_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/support/s3"
if [[ ! -x "$s3_dir/node_modules/.bin/s3rver" ||
      "$s3_dir/package-lock.json" -nt "$s3_dir/node_modules/.package-lock.json" ]]; then
  echo "install-deps: npm ci in $s3_dir"
  (cd "$s3_dir" && npm ci --no-audit --no-fund)
fi
