/* SPDX-License-Identifier: BSD-3-Clause */
/* The floor of a stream of frames between two cores: a producer process
 * copies frames of LEN bytes into a ring of shared memory laid out as the
 * shm fabric's (256 slots of 4 KiB + 192 bytes for frames up to 4 KiB, a
 * stamp word leading each slot, the frame from byte 28 as a payload after
 * its headers), a consumer process copies each one out into a buffer of
 * its own, both with `rep movsb`, the consumer fetching the next slot's
 * first lines ahead as the fabric's poll does. Prints the time per frame
 * and the bytes per second of each of four runs: both copy, only the
 * producer copies (the consumer takes the stamps), only the consumer, and
 * neither (the stamps' hand-over alone). What a transport's frames of that
 * size can reach on this machine's two cores, beside which the per-frame
 * work of the device shows (docs/benchmarks.md, "The ring's floor",
 * session 73). Pin nothing else to cores 0 and 1 meanwhile;
 * contrib/bench/core_rtt.c says which placement the two cores are in.
 *
 *   cc -O2 -o ring_stream contrib/bench/ring_stream.c
 *   ./ring_stream [LEN [STRIDE]]
 *
 * LEN: the frame's bytes (default 4096); STRIDE: bytes from one slot to
 * the next, a multiple of 64 that holds the frame (default: the frame's
 * lines and one more, 4,224 for 4 KiB; the fabric's slots are 4,288).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

enum { nslot = 256, frame_offset = 28, prefetch_lines = 4 };

struct run_kind {
    const char *name;
    int producer_copies, consumer_copies;
};

static void copy(uint8_t *d, const uint8_t *s, size_t n)
{
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

static _Atomic uint64_t *stamp_of(uint8_t *slot) { return (_Atomic uint64_t *)slot; }

/* The producer's side: frame k goes into slot k % nslot once the consumer
 * has taken frame k - nslot (its head word), then its stamp says k + 1. */
static void produce(uint8_t *ring, size_t slot_size, _Atomic uint64_t *head, size_t len,
                    long frames, int copies)
{
    uint8_t *src = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
    memset(src, 1, len);
    uint64_t taken = 0;
    for (long k = 0; k < frames; ++k) {
        while (k - taken >= nslot) {
            taken = atomic_load_explicit(head, memory_order_acquire);
        }
        uint8_t *s = ring + (k % nslot) * slot_size;
        if (copies) {
            copy(s + frame_offset, src, len);
        }
        atomic_store_explicit(stamp_of(s), k + 1, memory_order_release);
    }
}

/* One run: the consumer (the parent) times the frames after a tenth of
 * warm-up; ns per frame. */
static double run(size_t len, size_t slot_size, long frames, struct run_kind kind)
{
    size_t bytes = 64 + slot_size * nslot;
    uint8_t *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        perror("ring_stream: mmap");
        exit(2);
    }
    memset(map, 0, bytes);
    _Atomic uint64_t *head = (_Atomic uint64_t *)map;
    uint8_t *ring = map + 64;
    pid_t child = fork();
    if (child == 0) {
        bench_pin(0);
        produce(ring, slot_size, head, len, frames, kind.producer_copies);
        _exit(0);
    }
    bench_pin(1);
    uint8_t *dst = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
    memset(dst, 0, len);
    double t0 = 0;
    for (long k = 0; k < frames; ++k) {
        uint8_t *s = ring + (k % nslot) * slot_size;
        while (atomic_load_explicit(stamp_of(s), memory_order_acquire) != (uint64_t)k + 1) {
        }
        if (k == frames / 10) {
            t0 = bench_ns();
        }
        const uint8_t *next = ring + ((k + 1) % nslot) * slot_size;
        for (int i = 0; i < prefetch_lines; ++i) {
            __builtin_prefetch(next + 64 * i);
        }
        if (kind.consumer_copies) {
            copy(dst, s + frame_offset, len);
        }
        atomic_store_explicit(head, k + 1, memory_order_release);
    }
    double ns = (bench_ns() - t0) / (frames - frames / 10);
    waitpid(child, NULL, 0);
    munmap(map, bytes);
    free(dst);
    return ns;
}

int main(int argc, char **argv)
{
    size_t len = argc > 1 ? strtoul(argv[1], NULL, 0) : 4096;
    size_t slot_size = argc > 2 ? strtoul(argv[2], NULL, 0)
                                : (frame_offset + len + 63) / 64 * 64 + 64;
    if (len == 0 || len > (1u << 20) || slot_size % 64 || slot_size < frame_offset + len) {
        fprintf(stderr, "usage: ring_stream [LEN: 1 .. 1 MiB [STRIDE: a multiple of 64 "
                        "of at least LEN + %d]]\n", frame_offset);
        return 2;
    }
    long frames = (long)(1600000000 / (len + 1000));   /* about 1.6 GB */
    const struct run_kind kinds[] = {
        {"both copy", 1, 1},
        {"producer copies", 1, 0},
        {"consumer copies", 0, 1},
        {"stamps only", 0, 0},
    };
    printf("# %zu-byte frames in slots of %zu bytes, %ld per run\n# %-16s %10s %10s\n", len,
           slot_size, frames, "run", "ns/frame", "GB/s");
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; ++i) {
        double ns = run(len, slot_size, frames, kinds[i]);
        printf("  %-16s %10.1f %10.2f\n", kinds[i].name, ns, len / ns);
    }
    return 0;
}
