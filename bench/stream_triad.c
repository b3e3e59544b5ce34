/* STREAM-style bandwidth reference for bench/cpu.py: what plain C gets from memory on this machine.

     cc -O3 -march=native bench/stream_triad.c -o /tmp/stream_triad -lpthread
     /tmp/stream_triad [n_floats=16777216] [threads=all cores] [reps=10]

   Two float32 kernels over n elements, each thread on its own contiguous share (pthreads, one barrier per repetition):
     triad  a[i] = b[i] + s*c[i]        12 bytes/element (2 reads + 1 write), the STREAM triad in float
     fused  d[i] = a[i]*b[i] + c[i]     16 bytes/element (3 reads + 1 write), the same kernel as bench/cpu.py's
                                        elementwise workload
   Bytes follow the STREAM convention: the write-allocate read of the destination is not counted. Every thread
   first-touches its own share (so pages are mapped before timing, on the thread's NUMA node). One repetition is
   untimed (warm-up), then `reps` are timed; printed on one line, in GB/s (1e9 bytes/s):
     triad_median=.. triad_best=.. fused_median=.. fused_best=.. n=.. threads=.. reps=..
*/
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { long lo, hi; } share_t;

static float *A, *B, *C, *D;
static int nthreads;
static share_t *shares;
static pthread_barrier_t bar;
static volatile int phase_kernel;  /* 0 = init, 1 = triad, 2 = fused, -1 = quit */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run_share(int kernel, long lo, long hi) {
  float *restrict a = A, *restrict b = B, *restrict c = C, *restrict d = D;
  const float s = 3.0f;
  if (kernel == 0) {
    for (long i = lo; i < hi; i++) { a[i] = 0.0f; b[i] = 2.0f; c[i] = 0.5f; d[i] = 0.0f; }
  } else if (kernel == 1) {
    for (long i = lo; i < hi; i++) a[i] = b[i] + s * c[i];
  } else {
    for (long i = lo; i < hi; i++) d[i] = a[i] * b[i] + c[i];
  }
}

static void *worker(void *arg) {
  long k = (long)arg;
  for (;;) {
    pthread_barrier_wait(&bar);  /* start of a phase */
    int kernel = phase_kernel;
    if (kernel < 0) return NULL;
    run_share(kernel, shares[k].lo, shares[k].hi);
    pthread_barrier_wait(&bar);  /* end of the phase */
  }
}

/* Runs one phase on all threads (thread 0 is the caller); returns its wall time in seconds. */
static double phase(int kernel) {
  phase_kernel = kernel;
  double t0 = now();
  pthread_barrier_wait(&bar);
  run_share(kernel, shares[0].lo, shares[0].hi);
  pthread_barrier_wait(&bar);
  return now() - t0;
}

static int cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static double median(double *v, int n) {
  qsort(v, n, sizeof(double), cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 16777216L;
  nthreads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  int reps = argc > 3 ? atoi(argv[3]) : 10;
  if (n < 1 || nthreads < 1 || reps < 1) { fprintf(stderr, "usage: %s [n_floats] [threads] [reps]\n", argv[0]); return 2; }

  size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
  A = aligned_alloc(64, bytes); B = aligned_alloc(64, bytes); C = aligned_alloc(64, bytes); D = aligned_alloc(64, bytes);
  shares = calloc(nthreads, sizeof(share_t));
  if (!A || !B || !C || !D || !shares) { fprintf(stderr, "out of memory\n"); return 1; }
  for (int k = 0; k < nthreads; k++) {  /* contiguous shares, 16-float (64-byte) aligned boundaries */
    long q = (n / 16) / nthreads, r = (n / 16) % nthreads;
    shares[k].lo = 16 * (k * q + (k < r ? k : r));
    shares[k].hi = k == nthreads - 1 ? n : 16 * ((k + 1) * q + (k + 1 < r ? k + 1 : r));
  }

  pthread_barrier_init(&bar, NULL, nthreads);
  pthread_t *th = calloc(nthreads, sizeof(pthread_t));
  for (long k = 1; k < nthreads; k++) pthread_create(&th[k], NULL, worker, (void *)k);

  phase(0);               /* first touch */
  phase(1); phase(2);     /* warm-up */
  double *tt = calloc(reps, sizeof(double)), *tf = calloc(reps, sizeof(double));
  for (int r = 0; r < reps; r++) { tt[r] = phase(1); tf[r] = phase(2); }

  /* a check that the work happened: a = 2 + 3*0.5 = 3.5 after the triad; d = a*b + c = 7.5 */
  for (long i = 0; i < n; i += n / 7 + 1)
    if (A[i] != 3.5f || D[i] != 7.5f) { fprintf(stderr, "wrong result at %ld: a=%g d=%g\n", i, A[i], D[i]); return 1; }

  phase_kernel = -1;
  pthread_barrier_wait(&bar);
  for (int k = 1; k < nthreads; k++) pthread_join(th[k], NULL);

  double mt = median(tt, reps), mf = median(tf, reps);  /* sorts: [0] is the best */
  printf("triad_median=%.3f triad_best=%.3f fused_median=%.3f fused_best=%.3f n=%ld threads=%d reps=%d\n",
         12.0 * n / mt * 1e-9, 12.0 * n / tt[0] * 1e-9, 16.0 * n / mf * 1e-9, 16.0 * n / tf[0] * 1e-9, n, nthreads, reps);
  return 0;
}
