/* SPDX-License-Identifier: BSD-3-Clause
 *
 * What a byte copied between two processes costs on this machine, by the
 * kernel (process_vm_readv: mlx4x's single-copy RDMA and rendezvous
 * READs, UCX's CMA) against user space (memcpy out of a shared mapping:
 * mlx4x's packets through the rings and its SENDs by reference). On the
 * project's PVM guests the kernel's copy ran at a third of memcpy's speed,
 * which is why one kernel copy is not cheaper than two user-space copies
 * there (docs/benchmarks.md, "Where issue 33 stands").
 *
 *   gcc -O2 -o cma_vs_memcpy contrib/bench/cma_vs_memcpy.c && ./cma_vs_memcpy
 *
 * Two processes on cores 0 and 1. Before every pass the owner (core 0)
 * writes 16 MiB of a shared mapping and 16 MiB of its private memory; the
 * reader (core 1) then copies one or the other into its own buffer, 256
 * KiB a call (process_vm_readv) or a memcpy, passes alternating. Printed:
 * GB/s a pass; the first pass of each kind touches new pages. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

enum { total = 16 << 20, chunk = 256 << 10, passes = 12 };

int main(void)
{
    char *shared = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    volatile int *turn = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *owned = malloc(total);   /* the owner's private copy, read by the kernel */
    char *dst   = malloc(total);
    if (shared == MAP_FAILED || turn == MAP_FAILED || !owned || !dst) {
        perror("cma_vs_memcpy: memory");
        return 1;
    }
    memset(dst, 1, total);
    pid_t owner = fork();
    if (owner == 0) {   /* writes before each pass, waits for the reader's end */
        bench_pin(0);
        for (int pass = 0; pass <= passes; ++pass) {
            while (*turn != 2 * pass + 1) {
            }
            if (pass == passes) {
                _exit(0);
            }
            memset(shared, pass, total);
            memset(owned, pass, total);
            __sync_synchronize();
            *turn = 2 * pass + 2;
        }
    }
    bench_pin(1);
    for (int pass = 0; pass < passes; ++pass) {
        *turn = 2 * pass + 1;
        while (*turn != 2 * pass + 2) {
        }
        double t0 = bench_seconds();
        if (pass % 2 == 0) {
            for (size_t o = 0; o < total; o += chunk) {
                memcpy(dst + o, shared + o, chunk);
            }
        } else {
            for (size_t o = 0; o < total; o += chunk) {
                struct iovec l = {dst + o, chunk}, r = {owned + o, chunk};
                if (process_vm_readv(owner, &l, 1, &r, 1, 0) != chunk) {
                    perror("cma_vs_memcpy: process_vm_readv");
                    return 1;
                }
            }
        }
        printf("%-28s %6.2f GB/s\n", pass % 2 == 0 ? "memcpy from a shared mapping" : "process_vm_readv",
               total / (bench_seconds() - t0) / 1e9);
    }
    *turn = 2 * passes + 1;
    waitpid(owner, NULL, 0);
    return 0;
}
