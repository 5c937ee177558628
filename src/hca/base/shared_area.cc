// SPDX-License-Identifier: BSD-3-Clause
#include "hca/base/shared_area.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <utility>

namespace mlx4x {

namespace {

/// What the header page begins with.
struct area_header {
    uint64_t magic;
    uint64_t key;
    uint64_t len;
};
constexpr uint64_t area_magic = 0x3141455234584c4dull;   // "MLX4REA1" read backwards
static_assert(sizeof(area_header) <= shared_area_header);

constexpr unsigned required_seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

uint64_t random_key()
{
    uint64_t key = 0;
    while (key == 0) {
        if (getrandom(&key, sizeof(key), 0) != sizeof(key)) {
            return 0;
        }
    }
    return key;
}

} // namespace

result<shared_area> shared_area::create(uint32_t len)
{
    uint64_t key = random_key();
    if (!key || len == 0) {
        return status::invalid_param;
    }
    int fd = memfd_create("mlx4x-bounce", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return status::unsupported;
    }
    size_t total = shared_area_header + len;
    void  *p     = MAP_FAILED;
    if (ftruncate(fd, off_t(total)) == 0 && fcntl(fd, F_ADD_SEALS, required_seals) == 0) {
        p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (p == MAP_FAILED) {
        close(fd);
        return status::no_memory;
    }
    area_header h{area_magic, key, len};
    std::memcpy(p, &h, sizeof(h));
    shared_area a;
    a.data_ = static_cast<uint8_t *>(p) + shared_area_header;
    a.fd_   = fd;
    a.name_ = {int32_t(getpid()), uint32_t(fd), len, key};
    return a;
}

shared_area &shared_area::operator=(shared_area &&o) noexcept
{
    std::swap(data_, o.data_);
    std::swap(fd_, o.fd_);
    std::swap(name_, o.name_);
    return *this;
}

shared_area::~shared_area()
{
    if (data_) {
        munmap(data_ - shared_area_header, shared_area_header + name_.len);
    }
    if (fd_ >= 0) {
        close(fd_);
    }
}

result<peer_area> peer_area::map(const shared_area_name &name)
{
    if (!name.key || !name.len || name.pid <= 0) {
        return status::invalid_param;
    }
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/fd/%u", name.pid, name.fd);
    // Never open what is not a regular file: the open of a FIFO without a
    // writer blocks (the device would hang in its receive path), that of a
    // device may act. Checked before the open, which cannot block either
    // (O_NONBLOCK) should the peer swap its descriptor in between, and
    // again after it.
    struct stat st {};
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        return status::unreachable;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        return status::unreachable;
    }
    // Only a sealed file of this user, of the size named: nothing can
    // shrink it under the mapping (no fault past its end) and nobody else
    // chose its bytes.
    size_t total = shared_area_header + name.len;
    int    seals = fcntl(fd, F_GET_SEALS);
    void  *p     = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        uint64_t(st.st_size) == total && seals >= 0 &&
        (unsigned(seals) & required_seals) == required_seals) {
        p = mmap(nullptr, total, PROT_READ, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (p == MAP_FAILED) {
        return status::unreachable;
    }
    area_header h;
    std::memcpy(&h, p, sizeof(h));
    if (h.magic != area_magic || h.key != name.key || h.len != name.len) {
        munmap(p, total);
        return status::unreachable;   // another file at that pid and fd
    }
    peer_area a;
    a.data_ = static_cast<const uint8_t *>(p) + shared_area_header;
    a.len_  = name.len;
    return a;
}

peer_area &peer_area::operator=(peer_area &&o) noexcept
{
    std::swap(data_, o.data_);
    std::swap(len_, o.len_);
    return *this;
}

peer_area::~peer_area()
{
    if (data_) {
        munmap(const_cast<uint8_t *>(data_ - shared_area_header), shared_area_header + len_);
    }
}

} // namespace mlx4x
