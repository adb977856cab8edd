/* Multiply-add throughput of one core: each instruction the CPU kernels build on, issued
 * into 12 independent accumulators so that latency never stalls it. Prints one line per
 * instruction: "<name> <multiply-adds per instruction> <instructions per second>".
 * One more line times the int16 GEMM's block (int16_gemm.cpp's tile, registers only): 16
 * int16 pair products per accumulator, then the float work each block of 32 inputs ends
 * with (a conversion, the scale product and two multiply-adds): the rate its arithmetic
 * allows, reported per pair-product instruction. Built by benchmarks/cpu_prefill_ceiling.py with -O2 -march=native. */
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

/* The int16 GEMM's tile (int16_gemm.cpp) at each level: rows x 2 channel groups of
 * accumulators, 16 pair products per accumulator and block of 32 inputs. */
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define ROWS 4
#define VEC_I __m512i
#define VEC_F __m512
#define DOT_PAIRS(acc, w, x) _mm512_dpwssd_epi32(acc, w, x)
#define SET1_I _mm512_set1_epi32
#define SET1_F _mm512_set1_ps
#define ZERO_I _mm512_setzero_si512
#define ZERO_F _mm512_setzero_ps
#define TO_FLOAT _mm512_cvtepi32_ps
#define MUL _mm512_mul_ps
#define FMADD _mm512_fmadd_ps
#define REDUCE(v) _mm512_reduce_add_ps(v)
#define BLOCK_NAME "int16-gemm-block-zmm"
#define BLOCK_MACS 32
#elif defined(__AVX2__) && defined(__FMA__)
#define ROWS 3
#define VEC_I __m256i
#define VEC_F __m256
#define DOT_PAIRS(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
#define SET1_I _mm256_set1_epi32
#define SET1_F _mm256_set1_ps
#define ZERO_I _mm256_setzero_si256
#define ZERO_F _mm256_setzero_ps
#define TO_FLOAT _mm256_cvtepi32_ps
#define MUL _mm256_mul_ps
#define FMADD _mm256_fmadd_ps
#define REDUCE(v) (v)[0]
#define BLOCK_NAME "int16-gemm-block-ymm"
#define BLOCK_MACS 16
#endif
#define PAIRS 16 /* pair products per accumulator and block of 32 inputs */
#define TABLE 64 /* activations and scales cycled through, so nothing is hoisted */

#ifdef ROWS
static int pairs[TABLE + PAIRS * ROWS];
static float scales[TABLE + ROWS], sums[TABLE + ROWS];

/* The tile's arithmetic without its weight loads (the weights stay in two registers): per
 * pair step one broadcast activation pair per row into both groups, per block the float
 * epilogue. Printed per pair-product instruction, like the lines above. */
static void time_gemm_block(VEC_I w0, VEC_I w1) {
  for (int i = 0; i < TABLE + PAIRS * ROWS; ++i) pairs[i] = seed * (i + 1);
  for (int i = 0; i < TABLE + ROWS; ++i) {
    scales[i] = seed * 1e-3f * (i + 1);
    sums[i] = seed * 0.5f * i;
  }
  VEC_F out[ROWS][2];
  for (int r = 0; r < ROWS; ++r) out[r][0] = out[r][1] = ZERO_F();
  const long blocks = ROUNDS / PAIRS;
  const double t0 = now();
  for (long n = 0; n < blocks; ++n) {
    const int* x = pairs + n % TABLE;
    VEC_I dots[ROWS][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r) dots[r][0] = dots[r][1] = ZERO_I();
    _Pragma("GCC unroll 16") for (int p = 0; p < PAIRS; ++p) {
      _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r) {
        const VEC_I xv = SET1_I(x[p * ROWS + r]);
        dots[r][0] = DOT_PAIRS(dots[r][0], w0, xv);
        dots[r][1] = DOT_PAIRS(dots[r][1], w1, xv);
      }
    }
    const float* d = scales + n % TABLE;
    const float* sum = sums + n % TABLE;
    _Pragma("GCC unroll 2") for (int g = 0; g < 2; ++g) {
      const VEC_F scale = SET1_F(d[g]), minimum = SET1_F(d[g + 1]);
      _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r) {
        const VEC_F combined = MUL(scale, SET1_F(d[r]));
        out[r][g] = FMADD(TO_FLOAT(dots[r][g]), combined, out[r][g]);
        out[r][g] = FMADD(minimum, SET1_F(sum[r]), out[r][g]);
      }
    }
  }
  const double t = now() - t0;
  for (int r = 0; r < ROWS; ++r) sink += (int)(REDUCE(out[r][0]) + REDUCE(out[r][1]));
  printf("%s %d %.6g\n", BLOCK_NAME, BLOCK_MACS, blocks * PAIRS * ROWS * 2 / t);
}
#endif

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
  time_gemm_block(a, b);
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
  time_gemm_block(a, b);
#else
  fprintf(stderr, "neither AVX-512 VNNI nor AVX2 with FMA at -march=native\n");
  return 2;
#endif
  return 0;
}
