// SPDX-License-Identifier: BSD-3-Clause
// uct::job_oversubscribes_host: whether the job's ranks take turns on this
// host's cores, which UCX_MLX4X_TM_EAGER_SEGS=auto answers with a larger
// eager limit. The launcher's environment is untrusted: a value that is not
// a plain count must not decide anything.
#include "uct_mlx4x/mlx4x_locality.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace mlx4x::uct {
namespace {

/// An environment of its own for each case.
env_lookup env_of(const std::map<std::string, std::string> &vars)
{
    return [vars](const char *name) -> const char * {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    };
}

TEST(job_oversubscription, open_mpi_verdict_decides_when_given)
{
    // Open MPI's runtime knows the host's slots: its word stands even when
    // the rank count alone would say otherwise.
    EXPECT_TRUE(job_oversubscribes_host(
        env_of({{"OMPI_MCA_mpi_oversubscribe", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}), 64));
    EXPECT_FALSE(job_oversubscribes_host(
        env_of({{"OMPI_MCA_mpi_oversubscribe", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}), 2));
}

TEST(job_oversubscription, local_ranks_against_processors_online)
{
    EXPECT_TRUE(job_oversubscribes_host(env_of({{"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}), 2));
    EXPECT_FALSE(job_oversubscribes_host(env_of({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}), 2));
    EXPECT_TRUE(job_oversubscribes_host(env_of({{"MPI_LOCALNRANKS", "3"}}), 2));   // Hydra
    EXPECT_FALSE(job_oversubscribes_host(env_of({{"MPI_LOCALNRANKS", "3"}}), 8));
    // Processors unknown (sysconf failed): no verdict.
    EXPECT_FALSE(job_oversubscribes_host(env_of({{"MPI_LOCALNRANKS", "3"}}), -1));
}

TEST(job_oversubscription, no_launcher_no_verdict)
{
    EXPECT_FALSE(job_oversubscribes_host(env_of({}), 1));
}

TEST(job_oversubscription, values_that_are_not_counts_are_ignored)
{
    // Each of these, taken as a number (atoi, strtol), would say
    // "oversubscribed" on one processor or pass a verdict of 1; ignored,
    // the next source or no verdict decides.
    for (const char *bad : {"4x", " 4", "4 ", "+4", "-4", "0x4", "", "1e3",
                            "99999999999999999999999", "4\n"}) {
        SCOPED_TRACE(std::string("value '") + bad + "'");
        EXPECT_FALSE(job_oversubscribes_host(env_of({{"OMPI_COMM_WORLD_LOCAL_SIZE", bad}}), 1));
        EXPECT_FALSE(job_oversubscribes_host(env_of({{"MPI_LOCALNRANKS", bad}}), 1));
    }
    for (const char *bad : {"1x", " 1", "+1", "2", "yes"}) {
        SCOPED_TRACE(std::string("verdict '") + bad + "'");
        // Not Open MPI's 0 or 1: the rank count decides (here: not
        // oversubscribed).
        EXPECT_FALSE(job_oversubscribes_host(
            env_of({{"OMPI_MCA_mpi_oversubscribe", bad}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}}),
            1));
    }
    // A count of 0 ranks is no count: Hydra's word is taken instead.
    EXPECT_TRUE(job_oversubscribes_host(
        env_of({{"OMPI_COMM_WORLD_LOCAL_SIZE", "0"}, {"MPI_LOCALNRANKS", "2"}}), 1));
}

} // namespace
} // namespace mlx4x::uct
