/* The multiply-add peak of one core: twelve independent chains of AVX-512 fused
 * multiply-adds (more than the latency times the units, so the units, not the chains, set
 * the rate). The ceiling docs/PERFORMANCE.md sets the f32 GEMM and convolution rates
 * against. With `bf16`, the same for AVX512-BF16's `vdpbf16ps` (two products per lane per
 * instruction: 64 flops), the ceiling of the bf16 kernels.
 *
 *     gcc -O3 -mavx512f -mfma benches/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak
 *     /tmp/fma_peak bf16                                          # where the CPU has it
 *     taskset -c 0 /tmp/fma_peak & taskset -c 1 /tmp/fma_peak    # both cores at once
 */
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double seconds(struct timespec t0, struct timespec t1) {
    return (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

/* Twelve chains of `step` (each `flops` wide) on accumulators `a`, timed and printed. */
#define PEAK(name, flops, step)                                                              \
    do {                                                                                     \
        __m512 a[12];                                                                        \
        for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);                       \
        const long n = 400000000 / 12;                                                       \
        struct timespec t0, t1;                                                              \
        clock_gettime(CLOCK_MONOTONIC, &t0);                                                 \
        for (long k = 0; k < n; k++)                                                         \
            for (int i = 0; i < 12; i++) a[i] = step;                                        \
        clock_gettime(CLOCK_MONOTONIC, &t1);                                                 \
        float sum = 0; /* printed, so the chains are not optimised away */                   \
        for (int i = 0; i < 12; i++) sum += _mm512_reduce_add_ps(a[i]);                      \
        printf("%s: %.1f GFLOP/s on one core (checksum %g)\n", name,                         \
               (double)n * 12 * (flops) / seconds(t0, t1) / 1e9, sum);                       \
    } while (0)

static void f32_peak(void) {
    const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    PEAK("f32 FMA", 32, _mm512_fmadd_ps(a[i], b, c));
}

__attribute__((target("avx512bf16"))) static void bf16_peak(void) {
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3f803f80), c = (__m512bh)_mm512_set1_epi32(0x33d633d6);
    PEAK("bf16 vdpbf16ps", 64, _mm512_dpbf16_ps(a[i], b, c));
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "bf16") == 0) {
        if (!__builtin_cpu_supports("avx512bf16")) {
            printf("no AVX512-BF16 on this CPU\n");
            return 1;
        }
        bf16_peak();
    } else {
        f32_peak();
    }
    return 0;
}
