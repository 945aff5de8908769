/* The FMA peak of one core: twelve independent chains of AVX-512 fused multiply-adds (more
 * than the FMA latency times the units, so the units, not the chains, set the rate).
 * The ceiling docs/PERFORMANCE.md sets the f32 GEMM and convolution rates against.
 *
 *     gcc -O3 -mavx512f -mfma benches/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak
 *     taskset -c 0 /tmp/fma_peak & taskset -c 1 /tmp/fma_peak    # both cores at once
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

int main(void) {
    __m512 a[12];
    const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    const long n = 400000000 / 12;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; k < n; k++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    float sum = 0; /* printed, so the chains are not optimised away */
    for (int i = 0; i < 12; i++) sum += _mm512_reduce_add_ps(a[i]);
    printf("%.1f GFLOP/s on one core (checksum %g)\n", (double)n * 12 * 32 / s / 1e9, sum);
    return 0;
}
