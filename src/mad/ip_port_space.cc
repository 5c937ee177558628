// SPDX-License-Identifier: BSD-3-Clause
#include "mad/ip_port_space.h"

#include "hca/base/log.h"
#include "hca/base/process.h"

#include <arpa/inet.h>
#include <cerrno>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <random>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mlx4x::mad::ip {

namespace {

constexpr size_t table_entries = 65536;
constexpr size_t table_size    = table_entries * sizeof(port_space::binding);

/// Low word of binding::owner.
enum entry_state : uint32_t { free_entry = 0, claiming = 1, bound = 2 };

constexpr uint64_t owner_word(int pid, entry_state s) { return uint64_t(uint32_t(pid)) << 32 | s; }
constexpr int          owner_pid(uint64_t w) { return int(w >> 32); }
constexpr entry_state  owner_state(uint64_t w) { return entry_state(w & 0xffffffffu); }

/// A bound entry counts while its process runs (and is the one that bound
/// it); an entry caught half-claimed counts while its pid runs.
bool entry_live(const port_space::binding &b, uint64_t w)
{
    switch (owner_state(w)) {
    case free_entry: return false;
    case claiming:   return kill(owner_pid(w), 0) == 0 || errno != ESRCH;
    case bound:      return process_alive(owner_pid(w), b.start_time);
    }
    return false;
}

} // namespace

bool is_local_address(uint32_t ipv4)
{
    if ((ntohl(ipv4) >> 24) == 127) {
        return true;
    }
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) {
        return false;
    }
    bool found = false;
    for (ifaddrs *a = list; a && !found; a = a->ifa_next) {
        found = a->ifa_addr && a->ifa_addr->sa_family == AF_INET &&
                reinterpret_cast<const sockaddr_in *>(a->ifa_addr)->sin_addr.s_addr == ipv4;
    }
    freeifaddrs(list);
    return found;
}

result<std::unique_ptr<port_space>> port_space::open(const std::string &fabric_name)
{
    const std::string name = "/" + fabric_name + ".ipcm.v1";
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0) {
        MLX4X_ERROR("cannot open the IP port space /dev/shm%s: %m", name.c_str());
        return status::shmem_segment;
    }
    // Growing a fresh file to its size is all the initialisation there is
    // (zeroes = every port free), so racing openers cannot disagree.
    struct stat st {};
    if (fstat(fd, &st) != 0 ||
        (size_t(st.st_size) < table_size && ftruncate(fd, table_size) != 0)) {
        MLX4X_ERROR("cannot size the IP port space /dev/shm%s: %m", name.c_str());
        close(fd);
        return status::shmem_segment;
    }
    void *base = mmap(nullptr, table_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        MLX4X_ERROR("cannot map the IP port space /dev/shm%s: %m", name.c_str());
        return status::shmem_segment;
    }
    return std::unique_ptr<port_space>(new port_space(static_cast<binding *>(base)));
}

port_space::~port_space() { munmap(table_, table_size); }

/// Takes `port` if it is free or its owner is gone: one CAS decides
/// between racing binders.
bool port_space::try_claim(uint16_t port, uint32_t ipv4, uint16_t lid)
{
    binding &b = table_[port];
    uint64_t w = b.owner.load(std::memory_order_acquire);
    if (entry_live(b, w) ||
        !b.owner.compare_exchange_strong(w, owner_word(getpid(), claiming),
                                         std::memory_order_acq_rel)) {
        return false;
    }
    b.start_time = process_start_time(getpid());
    b.ipv4       = ipv4;
    b.lid        = lid;
    b.owner.store(owner_word(getpid(), bound), std::memory_order_release);
    return true;
}

result<uint16_t> port_space::bind(uint32_t ipv4, uint16_t port, uint16_t lid)
{
    if (port != 0) {
        return try_claim(port, ipv4, lid) ? result<uint16_t>(port) : status::busy;
    }
    constexpr unsigned range = ephemeral_last - ephemeral_first + 1;
    unsigned start = std::random_device{}() % range;
    for (unsigned i = 0; i < range; ++i) {
        auto p = uint16_t(ephemeral_first + (start + i) % range);
        if (try_claim(p, ipv4, lid)) {
            return p;
        }
    }
    return status::no_resource;
}

void port_space::unbind(uint16_t port)
{
    uint64_t mine = owner_word(getpid(), bound);
    table_[port].owner.compare_exchange_strong(mine, owner_word(0, free_entry),
                                               std::memory_order_acq_rel);
}

result<uint16_t> port_space::resolve(uint32_t ipv4, uint16_t port) const
{
    if (!is_local_address(ipv4)) {
        return status::invalid_addr;
    }
    const binding &b = table_[port];
    uint64_t w = b.owner.load(std::memory_order_acquire);
    if (owner_state(w) != bound || !entry_live(b, w) ||
        (b.ipv4 != 0 && b.ipv4 != ipv4)) {
        return status::unreachable;
    }
    return b.lid;
}

} // namespace mlx4x::mad::ip
