#!/bin/sh
# Stands in make check for the GoogleTest programs when configure found no
# GoogleTest (or was given --without-gtest): a SKIP that says what was not
# built and why.
echo "skip: test/mlx4x_gtest and test/mlx4x_fuzz were not built: configure found no GoogleTest"
echo "      (or ran --without-gtest); install libgtest-dev and run configure again"
exit 77
