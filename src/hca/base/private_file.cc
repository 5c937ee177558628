// SPDX-License-Identifier: BSD-3-Clause
#include "hca/base/private_file.h"
#include "hca/base/log.h"

#include <cerrno>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mlx4x {

namespace {

std::string user_name(uid_t uid)
{
    passwd  pw{}, *found = nullptr;
    char    buf[1024];
    if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found) {
        return found->pw_name;
    }
    return "?";
}

} // namespace

status check_private(int fd, const std::string &path, const char *what)
{
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        MLX4X_ERROR("cannot check %s %s: %m", what, path.c_str());
        return status::shmem_segment;
    }
    uid_t me = geteuid();
    if (S_ISREG(st.st_mode) && st.st_uid == me && (st.st_mode & 077) == 0) {
        return status::ok;
    }
    // Another user's file (or one others may open) under this name could
    // carry frames, keys and addresses of this job to them: never joined.
    MLX4X_ERROR("refusing %s %s: it is %s owned by uid %u (%s) with mode %04o, and "
                "must be a file of yours (uid %u) that only you can open (mode "
                "0600); someone else may have created it to read or change this "
                "job's traffic. Remove it ('rm %s', as its owner or root) when no "
                "job uses it, or choose another name with UCX_MLX4X_FABRIC",
                what, path.c_str(), S_ISREG(st.st_mode) ? "a file" : "not a regular file",
                unsigned(st.st_uid), user_name(st.st_uid).c_str(),
                unsigned(st.st_mode & 07777), unsigned(me), path.c_str());
    return status::shmem_segment;
}

result<private_fd> open_private(const std::string &path, open_how how, const char *what)
{
    constexpr int flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC;
    private_fd f;
    if (how == open_how::open_or_create) {
        f.fd      = open(path.c_str(), flags | O_CREAT | O_EXCL, 0600);
        f.created = f.fd >= 0;
    }
    if (f.fd < 0 && (how == open_how::open_existing || errno == EEXIST)) {
        f.fd = open(path.c_str(), flags);
    }
    if (f.fd < 0) {
        if (errno == ENOENT && how == open_how::open_existing) {
            MLX4X_ERROR("no %s %s: no mlx4x job runs on that fabric (check "
                        "UCX_MLX4X_FABRIC)", what, path.c_str());
            return status::no_device;
        }
        MLX4X_ERROR("cannot open %s %s: %m%s", what, path.c_str(),
                    errno == ELOOP ? " (a symbolic link: refused)" : "");
        return status::shmem_segment;
    }
    if (status s = check_private(f.fd, path, what); s != status::ok) {
        close(f.fd);
        return s;
    }
    return f;
}

} // namespace mlx4x
