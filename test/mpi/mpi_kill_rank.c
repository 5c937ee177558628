/* SPDX-License-Identifier: BSD-3-Clause */
/* One rank killed mid-transfer: the others must report an error and exit,
 * not hang. Every rank streams 1 MiB messages around a ring (send to the
 * right neighbour, receive from the left one, non-blocking); after a few
 * rounds the last rank kills itself with SIGKILL while its transfers are in
 * flight. The last rank only receives: under MPI's rules a receive from a
 * dead rank whose message never left may wait for ever (no transport has
 * anything to fail), so the ring is cut there and each survivor's waits
 * involve the dead rank only through its sends. Errors are returned (MPI_ERRORS_RETURN), so a survivor that sees
 * the failure prints
 *     rank R: transfer failed after N rounds: <MPI error string>
 * and exits with status 3. A survivor that completes all rounds (the death
 * went unnoticed) prints "rank R: finished" and exits 0; the test treats
 * that, like a hang, as a failure.
 * usage: mpi_kill_rank [rounds (default 1000)] */
#include <mpi.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG_SIZE   (1 << 20)
#define KILL_ROUND 3

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rounds = argc > 1 ? atoi(argv[1]) : 1000;
    setvbuf(stdout, NULL, _IONBF, 0);

    char *sbuf = malloc(MSG_SIZE), *rbuf = malloc(MSG_SIZE);
    memset(sbuf, rank, MSG_SIZE);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int n = 0; n < rounds; ++n) {
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        int rc = MPI_SUCCESS;
        if (left != size - 1) {
            rc = MPI_Irecv(rbuf, MSG_SIZE, MPI_BYTE, left, n, MPI_COMM_WORLD, &req[0]);
        }
        if (rc == MPI_SUCCESS && rank != size - 1) {
            rc = MPI_Isend(sbuf, MSG_SIZE, MPI_BYTE, right, n, MPI_COMM_WORLD, &req[1]);
        }
        if (rank == size - 1 && n == KILL_ROUND) {
            printf("rank %d: killing myself mid-transfer (round %d)\n", rank, n);
            raise(SIGKILL);
        }
        if (rc == MPI_SUCCESS) {
            rc = MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        }
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING];
            int len;
            MPI_Error_string(rc, msg, &len);
            printf("rank %d: transfer failed after %d rounds: %s\n", rank, n, msg);
            exit(3);   /* MPI_Finalize would wait for the dead rank */
        }
    }
    printf("rank %d: finished\n", rank);
    MPI_Finalize();
    return 0;
}
