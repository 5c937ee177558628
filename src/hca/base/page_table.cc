// SPDX-License-Identifier: BSD-3-Clause
#include "hca/base/page_table.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace mlx4x {

namespace {

uintptr_t page_size() { return uintptr_t(sysconf(_SC_PAGESIZE)); }

} // namespace

bool map_for_writing(void *p, size_t len)
{
    const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page_size() - 1);
    const uintptr_t end   = reinterpret_cast<uintptr_t>(p) + len;
    return madvise(reinterpret_cast<void *>(start), end - start, MADV_POPULATE_WRITE) == 0;
}

void first_touch(void *p, size_t len)
{
    (void)map_for_writing(p, len);
    auto        *bytes = static_cast<volatile unsigned char *>(p);
    const size_t page  = page_size();
    for (size_t at = 0; at < len; at += page) {
        bytes[at] = bytes[at];
    }
}

bool page_mapped(const void *p)
{
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    uint64_t entry  = 0;
    off_t    offset = off_t(reinterpret_cast<uintptr_t>(p) / page_size() * sizeof(entry));
    bool     ok     = pread(fd, &entry, sizeof(entry), offset) == ssize_t(sizeof(entry));
    close(fd);
    return ok && (entry >> 63) != 0;   // bit 63: present
}

} // namespace mlx4x
