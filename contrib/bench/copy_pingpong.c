/* SPDX-License-Identifier: BSD-3-Clause */
/* How fast the device's payload copies move bytes between two cores: two
 * processes ping-pong a message through two rings of shared memory (256
 * slots each, as the shm fabric's), the sender copying it into a slot and
 * publishing the slot's sequence word, the receiver copying it out, with
 * three ways of copying: glibc's memcpy, the 64-byte SSE2 moves
 * base/copy.h uses below 2 KiB, and `rep movsb`. Prints the median of
 * RUNS one-way times of each (ns), alternated. Pin nothing else to cores
 * 0 and 1 meanwhile; contrib/bench/core_rtt.c says which placement the
 * two cores are in (design-notes.md, "Copies of a few KiB").
 *
 *   cc -O2 -o copy_pingpong contrib/bench/copy_pingpong.c
 *   ./copy_pingpong [LEN [RUNS]]    (default 8000 bytes, 5 runs)
 */
#define _GNU_SOURCE
#include <emmintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

enum { nslot = 256, exchanges = 100000 };
enum way { libc_memcpy, sse2_blocks, rep_movsb, ways };
static const char *way_name[ways] = {"memcpy", "sse2-64B", "rep-movsb"};

static void copy(enum way w, uint8_t *d, const uint8_t *s, size_t n)
{
    switch (w) {
    case libc_memcpy:
        memcpy(d, s, n);
        return;
    case rep_movsb:
        __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
        return;
    default: {
        size_t i = 0;
        for (; i + 64 < n; i += 64) {
            __m128i a = _mm_loadu_si128((const void *)(s + i));
            __m128i b = _mm_loadu_si128((const void *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const void *)(s + i + 32));
            __m128i e = _mm_loadu_si128((const void *)(s + i + 48));
            _mm_storeu_si128((void *)(d + i), a);
            _mm_storeu_si128((void *)(d + i + 16), b);
            _mm_storeu_si128((void *)(d + i + 32), c);
            _mm_storeu_si128((void *)(d + i + 48), e);
        }
        memcpy(d + n - 64, s + n - 64, 64);
    }
    }
}

/* A slot: its sequence word in the first line, the payload from byte 64. */
static uint8_t *slot(uint8_t *ring, size_t slot_size, uint64_t k)
{
    return ring + (k % nslot) * slot_size;
}

/* One run: the parent times `exchanges` round trips after a tenth of warm-up. */
static double run(enum way w, size_t len)
{
    size_t slot_size = (len + 64 + 4095) / 4096 * 4096;
    uint8_t *ring[2];
    for (int r = 0; r < 2; ++r) {
        ring[r] = mmap(NULL, slot_size * nslot, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (ring[r] == MAP_FAILED) {
            perror("copy_pingpong: mmap");
            exit(2);
        }
        memset(ring[r], 0, slot_size * nslot);
    }
    pid_t child = fork();
    (void)bench_pin(child ? 0 : 1);
    uint8_t *buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
    memset(buf, 1, len);
    int out = child ? 0 : 1, in = 1 - out;
    double t0 = 0;
    for (uint64_t k = 0; k < exchanges + exchanges / 10; ++k) {
        if (k == exchanges / 10) {
            t0 = bench_ns();
        }
        for (int step = 0; step < 2; ++step) {
            if ((step == 0) == (child != 0)) {   /* parent sends first */
                uint8_t *s = slot(ring[out], slot_size, k);
                copy(w, s + 64, buf, len);
                atomic_store_explicit((_Atomic uint64_t *)s, k + 1, memory_order_release);
            } else {
                uint8_t *s = slot(ring[in], slot_size, k);
                while (atomic_load_explicit((_Atomic uint64_t *)s, memory_order_acquire) != k + 1) {
                    _mm_pause();
                }
                copy(w, buf, s + 64, len);
            }
        }
    }
    double one_way = (bench_ns() - t0) / exchanges / 2;
    if (!child) {
        _exit(0);
    }
    waitpid(child, NULL, 0);
    free(buf);
    munmap(ring[0], slot_size * nslot);
    munmap(ring[1], slot_size * nslot);
    return one_way;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t len  = argc > 1 ? strtoul(argv[1], NULL, 0) : 8000;
    int    runs = argc > 2 ? atoi(argv[2]) : 5;
    if (len < 64 || runs < 1 || runs > 100) {
        fprintf(stderr, "usage: copy_pingpong [LEN (>= 64) [RUNS (1-100)]]\n");
        return 2;
    }
    double t[ways][100];
    for (int r = 0; r < runs; ++r) {
        for (int w = 0; w < ways; ++w) {
            t[w][r] = run((enum way)w, len);
        }
    }
    printf("# copy_pingpong: %zu bytes one way, median of %d runs (ns)\n", len, runs);
    for (int w = 0; w < ways; ++w) {
        qsort(t[w], (size_t)runs, sizeof(double), cmp);
        printf("%-10s %8.0f\n", way_name[w], t[w][runs / 2]);
    }
    return 0;
}
