// SPDX-License-Identifier: BSD-3-Clause
#include "hca/base/process.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <signal.h>

namespace mlx4x {

uint64_t process_start_time(int pid)
{
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = std::fopen(path, "r");
    if (!f) {
        return 0;
    }
    char buf[1024];
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    const char *p = std::strrchr(buf, ')');   // comm may contain spaces
    if (!p) {
        return 0;
    }
    unsigned long long start = 0;
    // after ")": state(3) ... starttime is field 22, i.e. 20th after ")"
    int field = 2;
    for (const char *c = p + 1; *c; ++c) {
        if (*c == ' ' && ++field == 22) {
            start = std::strtoull(c + 1, nullptr, 10);
            break;
        }
    }
    return start;
}

bool process_alive(int pid, uint64_t start_time)
{
    if (pid <= 0) {
        return false;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) {
        return false;
    }
    uint64_t st = process_start_time(pid);
    return st == 0 || st == start_time;
}

} // namespace mlx4x
