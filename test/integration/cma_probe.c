/* SPDX-License-Identifier: BSD-3-Clause */
/* Whether two sibling processes of this user may read each other's memory
 * with process_vm_readv, as mlx4x's single-copy transfers between MPI ranks
 * need (a Yama ptrace_scope >= 1, a seccomp filter or missing capabilities
 * forbid it). Exit 0: allowed; 1: not (the reason on stdout). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
    static volatile uint64_t word = 0x6d6c783478ull;
    int p[2];
    if (pipe(p) != 0) {
        perror("pipe");
        return 1;
    }
    pid_t holder = fork();
    if (holder == 0) {          /* keeps its word mapped until killed */
        pause();
        _exit(0);
    }
    pid_t reader = fork();
    if (reader == 0) {          /* its sibling reads it */
        uint64_t got = 0;
        struct iovec l = {&got, sizeof(got)};
        struct iovec r = {(void *)&word, sizeof(word)};
        ssize_t n = process_vm_readv(holder, &l, 1, &r, 1, 0);
        if (n != (ssize_t)sizeof(got) || got != word) {
            printf("process_vm_readv between sibling processes: %s\n",
                   n < 0 ? strerror(errno) : "short or wrong read");
            _exit(1);
        }
        printf("process_vm_readv between sibling processes: allowed\n");
        _exit(0);
    }
    int st = 1;
    waitpid(reader, &st, 0);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
