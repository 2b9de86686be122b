#!/usr/bin/env bash
# Installs a build into a scratch prefix and uses it as an outside project
# would: a CMake consumer (find_package, shared and static imported targets),
# a C consumer built with pkg-config, the core library's dependencies (zstd
# and xxhash only), and the Python module from the installed tree.
#   tests/install/run.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
libdir="$(dirname "$(find "$prefix" -name 'libcachegen_core.so' | head -1)")"
test -n "$libdir"

echo "-- the core links only zstd and xxhash (and the C/C++ runtime)"
needed="$(readelf -d "$libdir/libcachegen_core.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort)"
unexpected="$(grep -v -E '^(libzstd|libxxhash|libstdc\+\+|libm|libgcc_s|libc|ld-linux[^.]*)\.so' <<<"$needed" || true)"
if [ -n "$unexpected" ]; then
  echo "run.sh: libcachegen_core.so needs more than zstd and xxhash: $unexpected" >&2
  exit 1
fi
grep -q '^libzstd' <<<"$needed"
readelf -d "$libdir/libcachegen_core.so" | grep -q 'SONAME.*libcachegen_core\.so\.[0-9]'
for layer in store stream serve; do test -e "$libdir/libcachegen_$layer.so"; test -e "$libdir/libcachegen_$layer.a"; done

echo "-- CMake consumer: find_package(cachegen COMPONENTS core store stream)"
cmake -S "$here/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >"$work/consumer.log" ||
  { cat "$work/consumer.log"; exit 1; }
ninja -C "$work/consumer" >>"$work/consumer.log" || { cat "$work/consumer.log"; exit 1; }
"$work/consumer/consumer_shared"
"$work/consumer/consumer_static"
readelf -d "$work/consumer/consumer_shared" | grep -q 'NEEDED.*libcachegen_stream\.so'
# A component that was not built is refused by find_package.
mkdir -p "$work/missing"
printf 'cmake_minimum_required(VERSION 3.25)\nproject(m LANGUAGES CXX)\nfind_package(cachegen CONFIG REQUIRED COMPONENTS core nosuch)\n' \
  >"$work/missing/CMakeLists.txt"
if cmake -S "$work/missing" -B "$work/missing/b" -DCMAKE_PREFIX_PATH="$prefix" >"$work/missing.log" 2>&1; then
  echo "run.sh: find_package accepted a component that does not exist" >&2
  exit 1
fi

echo "-- C consumer: pkg-config cachegen-core"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
cc -std=c11 -Wall -Werror "$here/consumer.c" $(pkg-config --cflags --libs cachegen-core) -lm -o "$work/c_shared"
LD_LIBRARY_PATH="$libdir" "$work/c_shared"
# shellcheck disable=SC2046
cc -std=c11 "$here/consumer.c" $(pkg-config --cflags cachegen-core) "$libdir/libcachegen_core.a" \
  $(pkg-config --static --libs-only-other --libs-only-l cachegen-core | sed 's/-lcachegen_core//') -o "$work/c_static"
"$work/c_static"

module="$(find "$prefix" -name '_cachegen*.so' | head -1)"
if [ -n "$module" ]; then
  echo "-- Python: import cachegen from the installed tree"
  site="$(dirname "$(dirname "$module")")"
  # The interpreter the module was built for (recorded by CMake).
  python="$(cat "$build/python/interpreter")"
  PYTHONPATH="$site" "$python" -c '
import cachegen, numpy
kv = numpy.ones((1, 2, 16, 1, 8), numpy.float32)
assert cachegen.decode(cachegen.encode(kv, codec="fp16")).shape == kv.shape
print("python ok: cachegen", cachegen.__version__, "from", cachegen.__file__)'
fi
echo "install test ok"
