/* Multiply-add throughput of one core: each instruction the CPU kernels build on, issued
 * into 12 independent accumulators so that latency never stalls it. Prints one line per
 * instruction: "<name> <multiply-adds per instruction> <instructions per second>".
 * Built by benchmarks/cpu_prefill_ceiling.py with -O2 -march=native. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ACC 12
#define ROUNDS 20000000L

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static volatile int sink;
static volatile int seed = 3; /* operands the compiler cannot fold into constants */

/* TIME(name, macs, type, init, step, fold): ROUNDS x ACC instructions of `step`. */
#define TIME(name, macs, type, init, step, fold)                       \
  do {                                                                 \
    type acc[ACC];                                                     \
    for (int i = 0; i < ACC; ++i) acc[i] = init;                       \
    const double t0 = now();                                           \
    for (long n = 0; n < ROUNDS; ++n) {                                \
      _Pragma("GCC unroll 12") for (int i = 0; i < ACC; ++i) {        \
        acc[i] = step;                                                 \
      }                                                                \
    }                                                                  \
    const double t = now() - t0;                                       \
    for (int i = 0; i < ACC; ++i) sink += fold;                        \
    printf("%s %d %.6g\n", name, macs, ROUNDS * ACC / t);              \
  } while (0)

int main(void) {
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
  const __m512i a = _mm512_set1_epi16(seed), b = _mm512_set1_epi16(seed + 2);
  const __m512 x = _mm512_set1_ps(seed * 0.25f), y = _mm512_set1_ps(seed * 0.125f);
  TIME("vpdpwssd-zmm", 32, __m512i, _mm512_setzero_si512(), _mm512_dpwssd_epi32(acc[i], a, b),
       _mm512_reduce_add_epi32(acc[i]));
  TIME("vpdpbusd-zmm", 64, __m512i, _mm512_setzero_si512(), _mm512_dpbusd_epi32(acc[i], a, b),
       _mm512_reduce_add_epi32(acc[i]));
  TIME("vfmadd231ps-zmm", 16, __m512, _mm512_setzero_ps(), _mm512_fmadd_ps(x, y, acc[i]),
       (int)_mm512_reduce_add_ps(acc[i]));
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256i a = _mm256_set1_epi16(seed), b = _mm256_set1_epi16(seed + 2);
  const __m256 x = _mm256_set1_ps(seed * 0.25f), y = _mm256_set1_ps(seed * 0.125f);
  TIME("vpmaddwd+vpaddd-ymm", 16, __m256i, _mm256_setzero_si256(),
       _mm256_add_epi32(acc[i], _mm256_madd_epi16(a, b)), _mm256_extract_epi32(acc[i], 0));
  TIME("vpmaddubsw+vpmaddwd+vpaddd-ymm", 32, __m256i, _mm256_setzero_si256(),
       _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b),
                                                  _mm256_set1_epi16(1))),
       _mm256_extract_epi32(acc[i], 0));
  TIME("vfmadd231ps-ymm", 8, __m256, _mm256_setzero_ps(), _mm256_fmadd_ps(x, y, acc[i]),
       (int)acc[i][0]);
#else
  fprintf(stderr, "neither AVX-512 VNNI nor AVX2 with FMA at -march=native\n");
  return 2;
#endif
  return 0;
}
