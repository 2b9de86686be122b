#!/usr/bin/env bash
# Builds everything and runs every test (after fetching llama.cpp and building
# its llama-server, scripts/build-llama-server.sh):
#   1. Release build (build/) + ctest (with the Python module's pytest suite,
#      python_test, and the install test, install_test: tests/install/run.sh)
#   2. ASan+UBSan build (build-asan/) + ctest
#   3. libFuzzer build with clang (build-fuzz/); each tests/fuzz target runs
#      for FUZZ_SECONDS (default 60)
#   4. smoke run of `cachegen bench --json`, parsed as JSON
# With nvcc on PATH the Release build also compiles the CUDA decoder
# (CACHEGEN_CUDA=ON: a CUDA compile error fails the run); its test skips
# where no GPU is. CACHEGEN_SETUP_CUDA=1 (what .ci/run sets) lets setup.sh
# install Debian's CUDA toolkit first where no nvcc is present.
# Exits non-zero on any failure; the last line sums the ctest results.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"

bash scripts/setup.sh
# llama.cpp (npm registry) for the engine adapter, eval and their tests; without it they are not built.
bash scripts/fetch-llama.sh || echo "test.sh: llama.cpp not fetched; llama.cpp tests are not built" >&2
# llama.cpp's own llama-server (about 5 minutes on two cores) for the slot-file interop test.
bash scripts/build-llama-server.sh -j"$JOBS" ||
  echo "test.sh: llama-server not built; LlamaServerSlotTest skips" >&2

passed_total=0
failed_total=0

# Runs ctest in build dir $1 and adds its counts to the totals.
run_ctest() {
  local dir="$1" log rc=0
  log="$(mktemp)"
  (cd "$dir" && ctest --output-on-failure -j2 --timeout 600) 2>&1 | tee "$log" || rc=$?
  # "100% tests passed, 0 tests failed out of 42"
  local line total failed
  line="$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)"
  rm -f "$log"
  if [ -z "$line" ]; then
    echo "test.sh: no ctest summary in $dir" >&2
    return 1
  fi
  failed="$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")"
  total="$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line")"
  passed_total=$((passed_total + total - failed))
  failed_total=$((failed_total + failed))
  if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ]; then
    echo "test.sh: ctest failed in $dir ($failed of $total)" >&2
    return 1
  fi
}

# The CUDA decoder: compiled by the Release build when nvcc is on PATH.
cuda_args=(-DCACHEGEN_CUDA=AUTO)
if nvcc_version="$(nvcc --version 2>/dev/null)"; then
  cuda_args=(-DCACHEGEN_CUDA=ON)
  # Debian 12's nvcc 11.8 accepts GCC only up to 11, and its wrapper finds no
  # g++-11 next to the default GCC 12; clang 14 (installed above) it accepts.
  if grep -q 'release 11\.' <<<"$nvcc_version" && [ -z "${CUDAHOSTCXX:-}" ] &&
     ! command -v g++-11 >/dev/null && command -v clang++-14 >/dev/null; then
    cuda_args+=(-DCMAKE_CUDA_HOST_COMPILER=clang++-14)
  fi
  echo "test.sh: CUDA decoder compiled by $(command -v nvcc) ($(grep -o 'release [0-9.]*' <<<"$nvcc_version"))"
else
  echo "test.sh: no nvcc on PATH: the CUDA decoder is not compiled" >&2
fi

echo "== Release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" >/dev/null
ninja -C build -j"$JOBS"
run_ctest build

echo "== ASan+UBSan build"
# Without the CUDA decoder: its host plan is in the library (gpu_plan_test),
# and its device test only skips here.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCACHEGEN_SANITIZE=ON \
      -DCACHEGEN_BUILD_BENCH=OFF -DCACHEGEN_CUDA=OFF >/dev/null
ninja -C build-asan -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_ctest build-asan

shopt -s nullglob
fuzz_sources=(tests/fuzz/*_fuzz.cc)
if [ ${#fuzz_sources[@]} -gt 0 ]; then
  echo "== libFuzzer build (clang), ${FUZZ_SECONDS}s per target"
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCACHEGEN_FUZZ=ON \
        -DCACHEGEN_BUILD_TESTS=OFF -DCACHEGEN_BUILD_BENCH=OFF >/dev/null
  ninja -C build-fuzz -j"$JOBS"
  for src in "${fuzz_sources[@]}"; do
    name="$(basename "$src" .cc)"
    corpus="build-fuzz/corpus/$name"
    mkdir -p "$corpus"
    seeds=()
    if [ -d "tests/fuzz/corpus/$name" ]; then seeds=("tests/fuzz/corpus/$name"); fi
    echo "-- $name"
    log="build-fuzz/$name.log"
    if ! "build-fuzz/$name" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
         "$corpus" "${seeds[@]}" >"$log" 2>&1; then
      tail -n 60 "$log"
      echo "test.sh: fuzz target $name failed (log: $log)" >&2
      exit 1
    fi
    tail -n 6 "$log"
  done
else
  echo "== no fuzz targets under tests/fuzz"
fi

echo "== Python module from the build folder"
# The interpreter on PATH, whichever it is (python_test above ran the suite on the one it was built for).
PYTHONPATH=build/python python3 -c 'import cachegen; print("import cachegen ok:", cachegen.__version__)'

echo "== bench smoke"
build/cachegen bench --synthetic 4,2,64,128 --reps 1 --threads 2 --thread-scaling --json >build/bench_smoke.json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["codecs"], "no codecs"; ok=[c for c in d["codecs"] if c["status"]=="ok"]; assert ok and all([p["threads"] for p in c["thread_scaling"]]==[1,2] for c in ok), "thread_scaling"; print("bench json ok:", ", ".join(c["name"]+"="+c["status"] for c in d["codecs"]))' build/bench_smoke.json

echo "== CLI smoke"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
build/cachegen encode synthetic:2,2,64,200,5 -o "$tmp/a.cgkv" --levels 2 --chunk-tokens 64 >/dev/null
build/cachegen inspect "$tmp/a.cgkv" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d["chunks"]) == 4 and d["levels"] == 2'
for ext in npy safetensors kvraw; do
  build/cachegen decode "$tmp/a.cgkv" -o "$tmp/a.$ext" --level 1 >/dev/null
  build/cachegen encode "$tmp/a.$ext" -o "$tmp/b.cgkv" --codec fp16 >/dev/null
done
expect_rc() {  # expect_rc CODE CMD...: CMD must exit with CODE and print one "cachegen: error:" line
  local want="$1" rc=0 err
  shift
  err="$("$@" 2>&1 >/dev/null)" || rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -q '^cachegen: error: ' <<<"$err"; then
    echo "test.sh: '$*' exited $rc (want $want): $err" >&2
    exit 1
  fi
}
head -c 100 /dev/urandom >"$tmp/junk.cgkv"
expect_rc 1 build/cachegen inspect "$tmp/junk.cgkv"
# a flipped payload byte (the last: the last frame's last section): inspect verifies every section checksum
python3 -c 'import sys; b=bytearray(open(sys.argv[1],"rb").read()); b[-1]^=0x40; open(sys.argv[2],"wb").write(b)' \
  "$tmp/a.cgkv" "$tmp/flipped.cgkv"
expect_rc 1 build/cachegen inspect "$tmp/flipped.cgkv"
expect_rc 1 build/cachegen decode "$tmp/junk.cgkv" -o "$tmp/x.npy"
# A container that decodes to more than the decode bound is refused before anything is allocated.
expect_rc 1 build/cachegen decode "$tmp/a.cgkv" -o "$tmp/x.npy" --max-output-bytes 1000
expect_rc 1 build/cachegen encode "$tmp/missing.npy" -o "$tmp/x.cgkv"
expect_rc 1 build/cachegen encode synthetic:1,2 -o "$tmp/x.cgkv"
expect_rc 2 build/cachegen encode
expect_rc 2 build/cachegen encode synthetic:1,1,8,8 -o "$tmp/x.cgkv" --bits 2 --snr-db 10
expect_rc 2 build/cachegen encode synthetic:1,1,8,8 -o "$tmp/x.txt"
expect_rc 2 build/cachegen encode synthetic:1,1,8,8 -o "$tmp/x.cgkv" --bits 0
expect_rc 1 build/cachegen encode synthetic:1,1,8,8 -o "$tmp/x.cgkv" --codec q8 --levels 3
# An input larger than the machine: a clean error, not an abort (275 GB of f16).
expect_rc 1 build/cachegen encode synthetic:64,64,256,65536 -o "$tmp/x.cgkv"
expect_rc 2 build/cachegen demo --synthetic 1,1,8,8 --windows 2
# chunk store CLI: put/get round trip, verify finds a flipped byte
key=00112233445566778899aabbccddeeff
head -c 3000 /dev/zero >"$tmp/frame"
build/cachegen store put --store "file://$tmp/store" "$key" 1 "$tmp/frame" >/dev/null
build/cachegen store get --store "file://$tmp/store" "$key" 1 -o "$tmp/frame.out" >/dev/null
cmp -s "$tmp/frame" "$tmp/frame.out"
build/cachegen store verify --store "file://$tmp/store" >/dev/null
printf '\377' | dd of="$tmp/store/00/$key.1" bs=1 seek=2000 conv=notrunc 2>/dev/null
expect_rc 1 build/cachegen store verify --store "file://$tmp/store"
expect_rc 1 build/cachegen store get --store "file://$tmp/store" "$key" 1 -o "$tmp/frame.out"
# a mistyped store path is an error (and creates nothing), not an empty store
seq 1 64 >"$tmp/ids.txt"
expect_rc 1 build/cachegen store verify --store "file://$tmp/no-store"
expect_rc 1 build/cachegen fetch --store "file://$tmp/no-store" --tokens "$tmp/ids.txt" --deadline-ms 100
test ! -e "$tmp/no-store"
# store verify --deep checks the frames inside the records: a frame damaged before it was stored
# (its record whole) passes the record check and fails the deep one; so does an unbound frame.
build/cachegen put --store "file://$tmp/deep" synthetic:2,2,32,64 --tokens "$tmp/ids.txt" --chunk-tokens 32 >/dev/null
build/cachegen store verify --store "file://$tmp/deep" --deep >/dev/null
deep_key=$(basename "$(find "$tmp/deep" -name '*.0' | sort | head -1)" .0)
build/cachegen store get --store "file://$tmp/deep" "$deep_key" 0 -o "$tmp/deep.frame" >/dev/null
python3 -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[-1] ^= 1; open(sys.argv[1], "wb").write(b)' "$tmp/deep.frame"
build/cachegen store put --store "file://$tmp/deep" "$deep_key" 0 "$tmp/deep.frame" >/dev/null
build/cachegen store verify --store "file://$tmp/deep" >/dev/null
expect_rc 1 build/cachegen store verify --store "file://$tmp/deep" --deep
expect_rc 1 build/cachegen store put --store "file://$tmp/deep" "$deep_key" 0 "$tmp/frame" --bind
expect_rc 1 build/cachegen bench-stream --deadline-factors 0.5,abc
expect_rc 1 build/cachegen bench-stream --traces 10gbit,5gbit
build/cachegen bench-store --store mem:// --store "file://$tmp/bench" --ops 20 --frame-bytes 4096 --json \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); assert all(s["put"]["errors"]==0 and s["get"]["errors"]==0 for s in d["stores"])'
build/cachegen bench-store --store mem:// --service --threads 8 --requests 50 --json \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); assert all(s["all"]["requests"]==400 and s["all"]["errors"]==0 for s in d["stores"])'
build/cachegen bench-stream --synthetic 4,2,64,1024 --traces 10gbit,drop --reps 1 --deadline-factors 1 \
  --receive-path 2 >"$tmp/bench-stream.txt"
# One check per command: under set -e a failure before the last && of a list does not stop the script.
grep -q '^Receive path' "$tmp/bench-stream.txt"
grep -q '^Per row' "$tmp/bench-stream.txt"
grep -q '^Local level-0' "$tmp/bench-stream.txt"
echo "cli smoke ok"

if build/cachegen eval --help >/dev/null 2>&1; then
  echo "== eval smoke (llama.cpp)"
  # Automatic profiles go to this run's folder; the default model's is not learned here (about 95 s
  # on stories260K): the tiny model's is, by the demo below (seconds).
  export CACHEGEN_PROFILE_DIR="$tmp/profiles"
  build/cachegen eval --profile none --windows 1 --context 64 --continuation 16 --greedy 4 --bits 2 --quiet --json \
    --plot "$tmp/eval.png" >"$tmp/eval.json"
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
keys = {"codec", "setting", "bits_per_value", "ratio_vs_fp16", "ppl", "delta_ppl_pct", "kl", "top1_agreement", "greedy_match"}
assert d["model"] and d["rows"], "no rows"
for r in d["rows"]:
    assert keys <= set(r), r
fp16 = [r for r in d["rows"] if r["codec"] == "fp16"][0]
assert fp16["delta_ppl_pct"] == 0 and fp16["kl"] == 0, fp16
print("eval json ok:", len(d["rows"]), "rows")' "$tmp/eval.json"
  test -s "$tmp/eval.png"
  echo "== profile train smoke (llama.cpp, random-weight model)"
  build/cachegen make-model --shape tiny -o "$tmp/tiny.gguf" >/dev/null
  python3 -c 'import random; r = random.Random(1); w = "once upon a time there was a little girl who liked to play in the park with her dog".split(); print("\n<|endoftext|>\n".join(" ".join(r.choice(w) for _ in range(120)) for _ in range(6)))' >"$tmp/stories.txt"
  build/cachegen profile train --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" -o "$tmp/tiny.cgprof" \
    --contexts 2 --context-tokens 64 --continuation 16 2>/dev/null >"$tmp/profile.txt"
  grep -q 'key transforms learned, sensitivities measured, key channel weights from attention' "$tmp/profile.txt"
  grep -q 'value transforms learned' "$tmp/profile.txt"  # head dim 64: V transforms and weights by default
  build/cachegen eval --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" --profile "$tmp/tiny.cgprof" --codecs cachegen \
    --bits 2 --windows 1 --context 64 --continuation 16 --greedy 4 --quiet --json >"$tmp/eval_profile.json"
  # Profiles are trained for the learned quantizer by default; eval takes a profile's quantizer when --quantizer is not given.
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert [r for r in d["rows"] if r["codec"] == "cachegen" and r["setting"].endswith("profile lloyd")], d["rows"]; print("profile train ok")' "$tmp/eval_profile.json"
  # A KL target: the row's predicted KL is the target (the profile measured sensitivities).
  build/cachegen eval --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" --profile "$tmp/tiny.cgprof" --codecs cachegen \
    --bits 2 --max-kl 1e-3 --windows 1 --context 64 --continuation 16 --greedy 4 --quiet --json >"$tmp/eval_kl.json"
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); r = [r for r in d["rows"] if r["setting"].startswith("max-kl=0.001")][0]; assert abs(r["predicted_kl"] / 1e-3 - 1) < 1e-3, r; print("max-kl ok")' "$tmp/eval_kl.json"
  # capture: a model's own KV, whose RoPE bench reads from the file's metadata.
  build/cachegen capture --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" --context 64 -o "$tmp/cap.safetensors" >/dev/null
  build/cachegen bench "$tmp/cap.safetensors" --codecs cachegen --reps 1 --json >"$tmp/cap_bench.json"
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["codecs"][0]["status"] == "ok", d; print("capture ok")' "$tmp/cap_bench.json"
  build/cachegen profile train --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" -o "$tmp/tiny-uniform.cgprof" \
    --contexts 2 --context-tokens 64 --continuation 16 --quantizer uniform >/dev/null 2>&1
  build/cachegen eval --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" --profile "$tmp/tiny-uniform.cgprof" --codecs cachegen \
    --bits 2 --windows 1 --context 64 --continuation 16 --greedy 4 --quiet --json >"$tmp/eval_uniform.json"
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert [r for r in d["rows"] if r["setting"].endswith("profile")], d["rows"]; print("profile quantizer ok")' "$tmp/eval_uniform.json"
  # put/fetch with a model profile (synthetic KV: a profile learned without RoPE): its id is part of
  # the chunk keys, and a .cgkv coded with one is refused without it.
  build/cachegen profile train --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" -o "$tmp/norope.cgprof" \
    --contexts 2 --context-tokens 64 --continuation 16 --no-rope --no-sensitivity >/dev/null 2>&1
  seq 1 256 >"$tmp/ids256.txt"
  chain=(--tokens "$tmp/ids256.txt" --chunk-tokens 64)
  build/cachegen put --store "file://$tmp/pstore" synthetic:2,2,64,256 "${chain[@]}" --profile "$tmp/norope.cgprof" \
    --json >"$tmp/put.json" 2>"$tmp/put.err"
  # Synthetic KV is far from the random model's KV in some sections: those are coded with their own
  # statistics, and put says so.
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["sections_unlike_profile"] > 0, d' "$tmp/put.json"
  grep -q "sections were coded with their own statistics" "$tmp/put.err"
  # A KV input with a profile learned with RoPE undone: put takes the keys' RoPE as encode does.
  expect_rc 1 build/cachegen put --store mem:// synthetic:2,2,64,256 "${chain[@]}" --profile "$tmp/tiny.cgprof"
  build/cachegen put --store mem:// synthetic:2,2,64,256 "${chain[@]}" --profile "$tmp/tiny.cgprof" --rope normal \
    >/dev/null 2>&1
  for p in "--profile $tmp/norope.cgprof" ""; do
    # shellcheck disable=SC2086  # $p is one option and its value, or nothing
    build/cachegen fetch --store "file://$tmp/pstore" "${chain[@]}" $p --deadline-ms 60000 --json >"$tmp/fetch.json"
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["chunks"] == (4 if sys.argv[2] else 0), d' \
      "$tmp/fetch.json" "$p"
  done
  build/cachegen encode synthetic:2,2,64,256 -o "$tmp/p.cgkv" --chunk-tokens 64 --profile "$tmp/norope.cgprof" >/dev/null
  expect_rc 1 build/cachegen put --store "file://$tmp/pstore2" "$tmp/p.cgkv" "${chain[@]}"
  build/cachegen put --store "file://$tmp/pstore2" "$tmp/p.cgkv" "${chain[@]}" --profile "$tmp/norope.cgprof" >/dev/null
  # bench: the cachegen codec again with the profile, in the same run
  build/cachegen bench --synthetic 2,2,64,256 --codecs cachegen --profile "$tmp/norope.cgprof" --reps 1 --json \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); assert [c["status"] for c in d["codecs"]] == ["ok", "ok"] and d["codecs"][1]["name"] == "cachegen+prof", d["codecs"]'
  echo "put/fetch and bench with a profile ok"
  build/cachegen demo --windows 1 --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" >"$tmp/demo.txt" 2>"$tmp/demo.err"
  # Two runs: the default codec, then with the model's automatic profile (learned now, then cached).
  grep -q "learning this model's profile" "$tmp/demo.err"
  [ "$(grep -c '^    restored KV: ' "$tmp/demo.txt")" -eq 2 ]
  grep -q 'smaller than f16' "$tmp/demo.txt"
  grep -q "^the model's automatic profile, " "$tmp/demo.txt"
  # eval's default: the same automatic profile, now read from the cache.
  build/cachegen eval --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" --codecs cachegen --bits 2 --windows 1 \
    --context 64 --continuation 16 --greedy 4 --quiet --json >"$tmp/eval_auto.json"
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["profile"].startswith("automatic: read from"), d["profile"]; assert d["rows"][0]["predicted_kl"] is not None' "$tmp/eval_auto.json"
  build/cachegen demo --windows 1 --model "$tmp/tiny.gguf" --text "$tmp/stories.txt" --profile "$tmp/tiny.cgprof" \
    >"$tmp/demo_profile.txt" 2>/dev/null
  grep -q "^read from $tmp/tiny.cgprof" "$tmp/demo_profile.txt"
  if build/cachegen demo --windows 1 --profile "$tmp/tiny.gguf" >/dev/null 2>&1; then
    echo "test.sh: demo took a model file as its profile" >&2
    exit 1
  fi
  echo "model demo ok"
fi
build/cachegen demo --synthetic 2,2,64,64 >/dev/null

if [ "$failed_total" -eq 0 ]; then
  echo "tests: ${passed_total} passed, 0 failed"
else
  exit 1
fi
