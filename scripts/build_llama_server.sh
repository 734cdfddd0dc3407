#!/bin/sh
# Builds llama-server and llama-batched-bench from the llama.cpp sources
# vendored in the llama-cpp-python sdist we depend on, with the same
# CMAKE_ARGS as our install, into a cache directory, once. Prints the bin dir.
# Nothing of it is committed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ver=$(python -c "import llama_cpp; print(llama_cpp.__version__)")
cache=${RINGSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ringserve}/llama.cpp-$ver
bin=$cache/build/bin
if [ -x "$bin/llama-server" ] && [ -x "$bin/llama-batched-bench" ]; then
  echo "$bin"; exit 0
fi
mkdir -p "$cache"
if [ ! -d "$cache/src" ]; then
  pip download --no-binary :all: --no-deps -d "$cache/dl" "llama-cpp-python==$ver" >&2
  tar -xzf "$cache"/dl/llama_cpp_python-*.tar.gz -C "$cache"
  mv "$cache"/llama_cpp_python-*/vendor/llama.cpp "$cache/src"
fi
# shellcheck disable=SC2046
cmake -S "$cache/src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON $(sh "$here/cmake_args.sh") >&2
cmake --build "$cache/build" -j "$(nproc)" --target llama-server llama-batched-bench >&2
echo "$bin"
