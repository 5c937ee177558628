/* SPDX-License-Identifier: BSD-3-Clause */
/* What a process's first touch of a page costs, with and without the page
 * entered into its page table first (MADV_POPULATE_WRITE): the reason the
 * fabric's rings and the receive buffers are touched ahead of their first
 * messages (docs/benchmarks.md, "First messages of a job").
 *
 *   gcc -O2 -o page_touch contrib/bench/page_touch.c && ./page_touch
 *
 * 1. A 1.1 MiB shared mapping laid out as a fabric ring (one word written
 *    per 4,224-byte slot): its creator populates and writes it, then a
 *    child maps it again, as a peer process does, and writes it with and
 *    without populating first. 2. 16 MiB of anonymous huge pages, as the
 *    receive buffers: populated, then one byte written per 2 MiB page and
 *    per 4 KiB page. Times in microseconds. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define RING_LEN (264 * 4096)
#define SLOT 4224

static void touch_slots(char *p)
{
    for (size_t o = 0; o + 8 <= RING_LEN; o += SLOT) {
        __atomic_fetch_or((uint64_t *)(p + o), 0, __ATOMIC_RELAXED);
    }
}

static void ring_pass(const char *who, int fd, int populate)
{
    char *p = mmap(NULL, RING_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    double t0 = bench_us();
    if (populate && madvise(p, RING_LEN, MADV_POPULATE_WRITE) != 0) {
        perror("MADV_POPULATE_WRITE");
    }
    double t1 = bench_us();
    touch_slots(p);
    double t2 = bench_us();
    touch_slots(p);
    double t3 = bench_us();
    char pop[16] = "     -";
    if (populate) {
        snprintf(pop, sizeof(pop), "%6.0f", t1 - t0);
    }
    printf("ring, %-28s populate %s  first pass %6.0f  second pass %4.0f\n", who, pop,
           t2 - t1, t3 - t2);
    munmap(p, RING_LEN);
}

static void in_child(int fd, int populate, const char *who)
{
    fflush(stdout);
    if (fork() == 0) {
        ring_pass(who, fd, populate);
        exit(0);
    }
    wait(NULL);
}

int main(void)
{
    int fd = memfd_create("page_touch", 0);
    if (fd < 0 || ftruncate(fd, RING_LEN) != 0) {
        perror("memfd");
        return 1;
    }
    ring_pass("creator, populated:", fd, 1);
    in_child(fd, 1, "another process, populated:");
    in_child(fd, 0, "another process, not:");

    const size_t len = 16u << 20, huge = 2u << 20;
    char *m = mmap(NULL, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    char *p = (char *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
    (void)madvise(p, len, MADV_HUGEPAGE);
    double t0 = bench_us();
    (void)madvise(p, len, MADV_POPULATE_WRITE);
    double t1 = bench_us();
    for (size_t o = 0; o < len; o += huge) p[o] = 1;
    double t2 = bench_us();
    for (size_t o = 0; o < len; o += 4096) p[o] = 1;
    double t3 = bench_us();
    printf("16 MiB of huge pages: populate %6.0f  a byte per 2 MiB %4.0f  per 4 KiB %4.0f\n",
           t1 - t0, t2 - t1, t3 - t2);
    return 0;
}
