#!/usr/bin/env bash
# Builds stubhost._core with -fsanitize=address,undefined and runs tests/core against it.
# The instrumented extension is placed in a copy of the package that shadows the installed one.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/asan
stage=build/asan-stage
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTUBHOST_SANITIZE=ON \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build "$build" -j 2
rm -rf "$stage" && mkdir -p "$stage"
cp -r src/stubhost "$stage/"
cp "$build"/_core*.so "$stage/stubhost/"

libasan=$(g++ -print-file-name=libasan.so)
libubsan=$(g++ -print-file-name=libubsan.so)
# Python itself is not instrumented: preload the runtimes, and leave leak checking to the
# tests' own pool and /dev/shm accounting (CPython's arenas look like leaks to LSan).
export LD_PRELOAD="$libasan:$libubsan"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONPATH="$PWD/$stage"
python3 -c "import stubhost._core as c, sys; assert '$stage' in c.__file__, c.__file__"
python3 -m pytest tests/core -q -p no:cacheprovider
