#include "flowstate/core/half.h"

#include <stdexcept>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLOWSTATE_HAVE_F16C_PATH 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace flowstate {
namespace {

void to_half_portable(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = float16_bits(in[i]);
}

void from_half_portable(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = float16_value(in[i]);
}

#ifdef FLOWSTATE_HAVE_F16C_PATH
// Compiled for F16C whatever the build's -march; called only when the CPU has it. The tail
// (n % 8) goes through the same instructions, one lane at a time.
__attribute__((target("avx,f16c"))) void to_half_f16c(const float* in, std::uint16_t* out,
                                                      std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) {
    const __m128i h =
        _mm_cvtps_ph(_mm_set_ss(in[i]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    out[i] = static_cast<std::uint16_t>(_mm_extract_epi16(h, 0));
  }
}

__attribute__((target("avx,f16c"))) void from_half_f16c(const std::uint16_t* in, float* out,
                                                        std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(in[i])));
}
#endif

bool use_f16c(HalfPath path) {
  switch (path) {
    case HalfPath::kPortable:
      return false;
    case HalfPath::kF16C:
      if (!cpu_has_f16c()) throw std::runtime_error("HalfPath::kF16C: this CPU has no F16C");
      return true;
    case HalfPath::kAuto:
      break;
  }
  return cpu_has_f16c();
}

}  // namespace

bool cpu_has_f16c() {
#ifdef FLOWSTATE_HAVE_F16C_PATH
  // CPUID leaf 1: ECX bit 29 F16C, bit 28 AVX, bit 27 OSXSAVE; XCR0 bits 1-2: the OS saves
  // the SSE and AVX registers (F16C's instructions are VEX-encoded).
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
    const unsigned need = (1u << 29) | (1u << 28) | (1u << 27);
    if ((c & need) != need) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0x6u) == 0x6u;
  }();
  return has;
#else
  return false;
#endif
}

void float_to_float16(const float* in, std::uint16_t* out, std::size_t n, HalfPath path) {
#ifdef FLOWSTATE_HAVE_F16C_PATH
  if (use_f16c(path)) return to_half_f16c(in, out, n);
#else
  use_f16c(path);
#endif
  to_half_portable(in, out, n);
}

void float16_to_float(const std::uint16_t* in, float* out, std::size_t n, HalfPath path) {
#ifdef FLOWSTATE_HAVE_F16C_PATH
  if (use_f16c(path)) return from_half_f16c(in, out, n);
#else
  use_f16c(path);
#endif
  from_half_portable(in, out, n);
}

}  // namespace flowstate
