/* SPDX-License-Identifier: BSD-3-Clause */
/* core_rtt: the round trip of one cache line between two cores, in ns.
 *
 * A small MPI message between two ranks costs little more than moving a
 * few cache lines from one core to the other, so how the machine places
 * the two cores (sharing a cache or not) sets UCX sm's latency and message
 * rate, and with them every mlx4x/sm ratio: where the line moves fast the
 * instructions each side runs decide, where it moves slowly the transfers
 * do. run-bench.sh records this figure next to each run so that its ratios
 * can be read with the placement they were measured in (the shared VMs
 * here move their vCPUs between placements from one minute to the next).
 *
 * usage: core_rtt [CPU_A CPU_B]   (default 0 1, the cores mpirun binds two
 *        ranks to); prints the median of 9 measurements of 20000 round
 *        trips each, in ns; exits 1 if the threads cannot be placed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"

enum { rounds = 20000, samples = 9 };

static _Alignas(64) atomic_uint line;   /* odd: the responder's turn */
static atomic_int state;   /* 0 starting, 1 responder placed, 2 it could not be, 3 stop */

static void *responder(void *arg)
{
    if (bench_pin(*(int *)arg) != 0) {
        atomic_store(&state, 2);
        return NULL;
    }
    atomic_store(&state, 1);
    while (atomic_load_explicit(&state, memory_order_relaxed) == 1) {
        unsigned v = atomic_load_explicit(&line, memory_order_acquire);
        if (v & 1) {
            atomic_store_explicit(&line, v + 1, memory_order_release);
        }
    }
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int cpu_a = argc > 2 ? atoi(argv[1]) : 0, cpu_b = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t t;
    if (bench_pin(cpu_a) != 0 || pthread_create(&t, NULL, responder, &cpu_b) != 0) {
        fprintf(stderr, "core_rtt: cannot run on cores %d and %d\n", cpu_a, cpu_b);
        return 1;
    }
    while (atomic_load(&state) == 0) {
    }
    if (atomic_load(&state) == 2) {
        pthread_join(t, NULL);
        fprintf(stderr, "core_rtt: cannot run on core %d\n", cpu_b);
        return 1;
    }
    double v[samples];
    for (int s = 0; s < samples; ++s) {
        double t0 = bench_ns();
        for (int i = 0; i < rounds; ++i) {
            unsigned mine = atomic_load_explicit(&line, memory_order_relaxed) + 1;
            atomic_store_explicit(&line, mine, memory_order_release);   /* odd */
            while (atomic_load_explicit(&line, memory_order_acquire) == mine) {
            }
        }
        v[s] = (bench_ns() - t0) / rounds;
    }
    atomic_store(&state, 3);
    pthread_join(t, NULL);
    qsort(v, samples, sizeof(v[0]), cmp);
    printf("%.0f\n", v[samples / 2]);
    return 0;
}
