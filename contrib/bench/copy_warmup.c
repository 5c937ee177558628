/* SPDX-License-Identifier: BSD-3-Clause */
/* How fast process_vm_readv/writev copy over the same buffers, pass after
 * pass: single copy's first passes over a set of buffers ran at a tenth
 * of its later speed on this VM, and the chooser measured it there
 * (docs/benchmarks.md, "Packets or single copy for a stream into many
 * buffers").
 *
 *   gcc -O2 -o copy_warmup contrib/bench/copy_warmup.c && ./copy_warmup
 *
 * Two processes on cores 1 and 0, 16 MiB each, written by their owners
 * first. Alone: the first process reads every 256 KiB chunk of the
 * second's buffer into its own, one call a chunk, six passes. Shared (a
 * shared READ's pattern): it reads the first half of each chunk while the
 * second process writes the other half into it, both at once. After a
 * pause: alone, with 200 ms between passes in which the reader writes 1
 * MiB of other memory over and over (a rank busy elsewhere, as between
 * the chooser's measurements of single copy). Printed: GB/s inside the
 * calls, per pass. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

enum { total = 16 << 20, chunk = 256 << 10, passes = 6 };

/* One pass of `half`-byte calls at offset `first` of every chunk; the
 * seconds spent inside the calls, or -1 on a failed call. */
static double pass(pid_t peer, char *local, char *remote, size_t first, size_t half, int to_peer)
{
    double in_calls = 0;
    for (size_t off = 0; off < total; off += chunk) {
        struct iovec l = {local + off + first, half}, r = {remote + off + first, half};
        double t0 = bench_seconds();
        ssize_t n = to_peer ? process_vm_writev(peer, &l, 1, &r, 1, 0)
                            : process_vm_readv(peer, &l, 1, &r, 1, 0);
        in_calls += bench_seconds() - t0;
        if (n != (ssize_t)half) {
            perror(to_peer ? "process_vm_writev" : "process_vm_readv");
            return -1;
        }
    }
    return in_calls;
}

/* `ms` milliseconds of writing other memory (1 MiB, over and over). */
static void busy_elsewhere(int ms)
{
    static char scratch[1 << 20];
    double end = bench_seconds() + ms * 1e-3;
    for (int i = 0; bench_seconds() < end; ++i) {
        memset(scratch, i, sizeof scratch);
    }
}

static int run(int shared, int pause_ms)
{
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) {
        perror("pipe");
        return 1;
    }
    pid_t parent = getpid();
    char *dst = aligned_alloc(4096, total);
    memset(dst, 0, total);
    pid_t child = fork();
    if (child == 0) {
        bench_pin(0);
        char *src = aligned_alloc(4096, total);
        memset(src, 1, total);
        (void)!write(to_parent[1], &src, sizeof src);
        int p;
        while (read(to_child[0], &p, sizeof p) == sizeof p) {
            double t = pass(parent, src, dst, chunk / 2, chunk / 2, 1);
            (void)!write(to_parent[1], &t, sizeof t);
        }
        _exit(0);
    }
    bench_pin(1);
    char *src;
    if (read(to_parent[0], &src, sizeof src) != sizeof src) {
        return 1;
    }
    size_t len = shared ? chunk / 2 : chunk;
    printf("%s:", shared ? "shared (reader / writer)" : pause_ms ? "after a pause" : "alone");
    for (int p = 0; p < passes; ++p) {
        if (pause_ms && p) {
            busy_elsewhere(pause_ms);
        }
        if (shared) {
            (void)!write(to_child[1], &p, sizeof p);
        }
        double r = pass(child, dst, src, 0, len, 0), w = 0;
        if (shared && read(to_parent[0], &w, sizeof w) != sizeof w) {
            w = -1;
        }
        if (r < 0 || w < 0) {
            break;
        }
        double bytes = (double)total / chunk * len;
        if (shared) {
            printf("  %.2f / %.2f", bytes / r / 1e9, bytes / w / 1e9);
        } else {
            printf("  %.2f", bytes / r / 1e9);
        }
    }
    printf("  GB/s a pass\n");
    kill(child, SIGTERM);
    waitpid(child, NULL, 0);
    free(dst);
    return 0;
}

int main(void)
{
    return run(0, 0) || run(1, 0) || run(0, 200);
}
