// SPDX-License-Identifier: BSD-3-Clause
// Files that processes of one user share (the fabric segment, its IP port
// space, the SM's lock): trusted only while nobody else can open them. A
// file someone else created first under the name a job will use would let
// that user read and change the job's traffic, so it is refused, never
// joined.
#pragma once

#include "hca/base/status.h"

#include <string>

namespace mlx4x {

enum class open_how {
    open_or_create,   ///< a missing file is created (O_EXCL, mode 0600)
    open_existing,    ///< a missing file is an error (diagnostic tools)
};

struct private_fd {
    int  fd      = -1;
    bool created = false;   ///< this call made the file
};

/// Opens `path` read-write without following a symbolic link, creating it
/// exclusively when `how` allows and it is missing, and refuses (one error
/// line naming the file, its owner and how to remove it; status
/// `shmem_segment`) a file that is not a regular file owned by this
/// process's effective uid with no access for group or others. `what`
/// names the file's role in that line ("fabric segment").
result<private_fd> open_private(const std::string &path, open_how how, const char *what);

/// The ownership and mode checks of open_private() on an open descriptor.
status check_private(int fd, const std::string &path, const char *what);

} // namespace mlx4x
