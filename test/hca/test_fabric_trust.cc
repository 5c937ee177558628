// SPDX-License-Identifier: BSD-3-Clause
// The fabric's files belong to their user (issue "trust boundaries"): a
// segment, IP port space or SM lock that another user created first, or
// that others may open, is refused with one error naming it; links are not
// followed; diagnostic opens create nothing; names that cannot be files of
// /dev/shm are refused; the wake-up sockets' names cannot be taken first;
// the files go when the fabric's last port leaves, and a process that
// mapped the fabric before maps it again.
#include "hca_fixture.h"
#include "hca/base/private_file.h"
#include "hca/fabric/shm_fabric.h"
#include "mad/ip_port_space.h"
#include "mad/sm.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

namespace mlx4x::test {
namespace {

using fabric::shm_fabric;

constexpr uid_t other_uid = 65534;   // "nobody" on Debian

class fabric_trust : public ::testing::Test {
protected:
    void SetUp() override
    {
        static int seq = 0;
        name = "mlx4x-trust-" + std::to_string(getpid()) + "-" + std::to_string(seq++);
        remove_all();
    }
    void TearDown() override { remove_all(); }

    void remove_all()
    {
        for (const char *suffix : {"", ".ipcm.v2", ".sm"}) {
            unlink(shm_fabric::path_of(name, suffix).c_str());
        }
    }
    std::string path(const char *suffix = "") const
    {
        return shm_fabric::path_of(name, suffix);
    }
    static bool exists(const std::string &p)
    {
        struct stat st {};
        return lstat(p.c_str(), &st) == 0;
    }
    /// The file `p` made by another user, with mode 0666: as an attacker
    /// who knows the name a job will use would leave it. Needs root.
    static void create_as_other_user(const std::string &p)
    {
        pid_t pid = fork();
        if (pid == 0) {
            umask(0);
            int fd = -1;
            if (setgid(other_uid) == 0 && setuid(other_uid) == 0) {
                fd = open(p.c_str(), O_RDWR | O_CREAT | O_EXCL, 0666);
            }
            _exit(fd >= 0 ? 0 : 1);
        }
        int st = 0;
        ASSERT_EQ(waitpid(pid, &st, 0), pid);
        ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "could not create " << p;
    }
    static bool logged(const std::string &what)
    {
        for (auto &[lvl, line] : log_capture::lines()) {
            if (lvl == log_level::error && line.find(what) != std::string::npos) {
                return true;
            }
        }
        return false;
    }

    std::string name;
};

#define NEEDS_ROOT()                                                        \
    if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user"

TEST_F(fabric_trust, a_segment_another_user_created_first_is_refused)
{
    NEEDS_ROOT();
    create_as_other_user(path());
    log_capture logs;
    auto f = shm_fabric::open(name);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error(), status::shmem_segment);
    EXPECT_TRUE(logged("owned by uid 65534")) << "the error names the owner";
    EXPECT_TRUE(logged("rm " + path())) << "and how to remove it";
    struct stat st {};
    ASSERT_EQ(stat(path().c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 0) << "the foreign file was not sized or written";
}

TEST_F(fabric_trust, the_ip_port_space_and_sm_lock_another_user_created_are_refused)
{
    NEEDS_ROOT();
    create_as_other_user(path(".ipcm.v2"));
    create_as_other_user(path(".sm"));
    log_capture logs;
    auto ps = mad::ip::port_space::open(name);
    ASSERT_FALSE(ps.ok());
    EXPECT_TRUE(logged("refusing IP port space " + path(".ipcm.v2")));
    fabric::loopback_fabric lo;
    auto sm = mad::subnet_manager::create(lo, path(".sm"), [] { return true; });
    ASSERT_FALSE(sm.ok());
    EXPECT_TRUE(logged("refusing SM lock " + path(".sm")));
}

TEST_F(fabric_trust, a_segment_of_ours_that_others_may_open_is_refused)
{
    int fd = open(path().c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fchmod(fd, 0644), 0);   // readable by everyone: frames, keys, data
    close(fd);
    log_capture logs;
    auto f = shm_fabric::open(name);
    ASSERT_FALSE(f.ok());
    EXPECT_TRUE(logged("mode 0644"));
}

TEST_F(fabric_trust, a_symbolic_link_in_the_segments_place_is_not_followed)
{
    std::string target = "/tmp/" + name + ".target";
    int fd = open(target.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    close(fd);
    ASSERT_EQ(symlink(target.c_str(), path().c_str()), 0);
    log_capture logs;
    auto f = shm_fabric::open(name);
    EXPECT_FALSE(f.ok());
    EXPECT_TRUE(logged("symbolic link"));
    struct stat st {};
    ASSERT_EQ(stat(target.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 0) << "the link's target was not sized";
    unlink(target.c_str());
}

TEST_F(fabric_trust, a_diagnostic_open_of_a_missing_fabric_creates_nothing)
{
    log_capture logs;
    shm_fabric::options o;
    o.how = open_how::open_existing;
    auto f = shm_fabric::open(name, o);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error(), status::no_device);
    EXPECT_FALSE(exists(path())) << "a mistyped name made a segment";
    EXPECT_TRUE(logged("no mlx4x job runs on that fabric"));
}

TEST_F(fabric_trust, names_that_cannot_be_a_file_of_dev_shm_are_refused)
{
    log_capture logs;
    EXPECT_EQ(shm_fabric::open(std::string(shm_fabric::max_name_len + 1, 'x')).error(),
              status::invalid_param);
    EXPECT_EQ(shm_fabric::open("../etc/x").error(), status::invalid_param);
    EXPECT_EQ(shm_fabric::open("").error(), status::invalid_param);
    EXPECT_TRUE(logged("UCX_MLX4X_FABRIC"));
    // The longest allowed name works, its companion files included.
    name = std::string(shm_fabric::max_name_len - 20, 'y') + std::to_string(getpid());
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto p = (*f)->attach();
    ASSERT_TRUE(p.ok());
    EXPECT_GE((*p)->wakeup_fd(), 0);
    EXPECT_TRUE(mad::ip::port_space::open(name).ok());
}

/// The wake-up socket's abstract name carried the fabric's name, which
/// anyone can guess: a squatter made the port unable to sleep (and could
/// take its wake-ups). Names now carry the fabric's random id.
TEST_F(fabric_trust, a_squatted_wake_up_name_does_not_stop_a_port_sleeping)
{
    int squat = socket(AF_UNIX, SOCK_DGRAM, 0);
    ASSERT_GE(squat, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    // The first port of a new fabric: LID 1, generation 1 (the old name).
    int n = std::snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "mlx4x:%s:1:1",
                          name.c_str());
    ASSERT_EQ(bind(squat, reinterpret_cast<sockaddr *>(&a),
                   socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n)),
              0);
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto p = (*f)->attach();
    ASSERT_TRUE(p.ok());
    EXPECT_EQ((*p)->lid(), 1);
    EXPECT_GE((*p)->wakeup_fd(), 0);
    close(squat);
}

TEST_F(fabric_trust, the_last_port_to_leave_removes_the_fabric_files)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(mad::ip::port_space::open(name).ok());
    auto a = (*f)->attach(), b = (*f)->attach();
    ASSERT_TRUE(a.ok() && b.ok());
    a->reset();
    EXPECT_TRUE(exists(path())) << "a port is still on the fabric";
    b->reset();
    EXPECT_FALSE(exists(path()));
    EXPECT_FALSE(exists(path(".ipcm.v2")));
}

TEST_F(fabric_trust, a_process_that_mapped_a_removed_fabric_joins_the_new_one)
{
    auto early = shm_fabric::open(name);   // mapped, no port yet
    auto first = shm_fabric::open(name);
    ASSERT_TRUE(early.ok() && first.ok());
    (void)(*first)->attach().take();       // attached, and gone: removed
    ASSERT_FALSE(exists(path()));
    auto later = shm_fabric::open(name);   // a new segment under the name
    ASSERT_TRUE(later.ok());
    auto on_later = (*later)->attach();
    auto on_early = (*early)->attach();
    ASSERT_TRUE(on_later.ok() && on_early.ok());
    EXPECT_EQ((*early)->fabric_id(), (*later)->fabric_id()) << "one fabric, not two";
    EXPECT_NE((*on_early)->lid(), (*on_later)->lid());
    EXPECT_TRUE((*on_later)->peer_alive((*on_early)->lid()));
}

TEST_F(fabric_trust, two_fabrics_have_different_ids)
{
    auto f1 = shm_fabric::open(name);
    auto f2 = shm_fabric::open(name + "-2");
    ASSERT_TRUE(f1.ok() && f2.ok());
    EXPECT_NE((*f1)->fabric_id(), (*f2)->fabric_id());
    unlink(shm_fabric::path_of(name + "-2").c_str());
}

} // namespace
} // namespace mlx4x::test
