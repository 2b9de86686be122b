// Run-time choice of SIMD code paths. The library is compiled for baseline
// x86-64; AVX2 kernels are separate functions compiled with
// __attribute__((target(...))) and called only when the running CPU has the
// features (so one binary runs on any x86-64 and uses AVX2 where present).
// Every SIMD kernel has a scalar twin with bit-identical results.
#pragma once

namespace cachegen::simd {

// True when the CPU has AVX2, F16C and BMI2 and SIMD was not switched off
// (environment CACHEGEN_SIMD=0 at start-up, or SetEnabled(false)).
bool Avx2();

// Forces the scalar paths (false) or re-enables SIMD where the CPU has it
// (true). For tests and benchmarks comparing the two; not thread-safe with
// concurrent decodes.
void SetEnabled(bool enabled);

// Avx2() and the CPU has FMA (the head transforms' kernels).
bool Fma();
// Avx2() and the CPU has AVX-512F and FMA: kernels that gain from 16-lane
// registers (the head transforms'), each bit-identical to its AVX2 twin.
bool Avx512();
// For tests comparing the AVX-512 kernels with the AVX2 ones (true: where the
// CPU has them).
void SetAvx512Enabled(bool enabled);

}  // namespace cachegen::simd
