#!/bin/sh
# One command for a fresh Debian machine: installs the packages and the UCX
# source tree mlx4x builds against, builds it, and runs the main job, a
# 2-rank Open MPI ping-pong over mlx4x (data verified, latency and bandwidth
# for 1 B .. 4 MiB).
set -e
cd "$(dirname "$0")/.."
contrib/install-deps.sh
[ -x configure ] || ./autogen.sh
[ -f Makefile ] || ./configure
make -j2
root=; [ "$(id -u)" -eq 0 ] && root=--allow-run-as-root
echo "mlx4x: running the main job (mpirun -np 2 contrib/mlx4x-run contrib/mlx4x-pingpong)"
exec mpirun $root --oversubscribe -np 2 contrib/mlx4x-run contrib/mlx4x-pingpong
