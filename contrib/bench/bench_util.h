/* SPDX-License-Identifier: BSD-3-Clause */
/* The clock and the pinning the micro-benchmarks of contrib/bench share
 * (each is built alone by a one-line cc command; this header comes with it
 * from the source's directory). */
#ifndef MLX4X_BENCH_UTIL_H
#define MLX4X_BENCH_UTIL_H

#ifndef _GNU_SOURCE
#error "define _GNU_SOURCE before the first #include (CPU_SET, sched_setaffinity)"
#endif
#include <sched.h>
#include <time.h>

/* Monotonic time in seconds, microseconds and nanoseconds. */
static inline double bench_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static inline double bench_us(void) { return bench_seconds() * 1e6; }
static inline double bench_ns(void) { return bench_seconds() * 1e9; }

/* Binds the calling thread to processing unit `cpu`: 0, or -1 (errno set)
 * where it may not run there. */
static inline int bench_pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return sched_setaffinity(0, sizeof s, &s);
}

#endif
