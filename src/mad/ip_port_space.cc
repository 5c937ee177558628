// SPDX-License-Identifier: BSD-3-Clause
#include "mad/ip_port_space.h"

#include "hca/base/log.h"
#include "hca/base/private_file.h"
#include "hca/base/process.h"
#include "hca/fabric/shm_fabric.h"

#include <arpa/inet.h>
#include <cstring>
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

result<ip_address> ip_address::of(const sockaddr &sa)
{
    ip_address a;
    a.family = sa.sa_family;
    if (sa.sa_family == AF_INET) {
        std::memcpy(a.bytes, &reinterpret_cast<const sockaddr_in &>(sa).sin_addr, 4);
    } else if (sa.sa_family == AF_INET6) {
        std::memcpy(a.bytes, &reinterpret_cast<const sockaddr_in6 &>(sa).sin6_addr, 16);
    } else {
        return status::invalid_addr;
    }
    return a;
}

uint16_t ip_address::port_of(const sockaddr &sa)
{
    return ntohs(sa.sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6 &>(sa).sin6_port
                                          : reinterpret_cast<const sockaddr_in &>(sa).sin_port);
}

bool ip_address::any() const
{
    static const uint8_t zero[16] = {};
    return std::memcmp(bytes, zero, size()) == 0;
}

bool ip_address::operator==(const ip_address &o) const
{
    return family == o.family && std::memcmp(bytes, o.bytes, size()) == 0;
}

sockaddr_storage ip_address::with_port(uint16_t port) const
{
    sockaddr_storage ss{};
    if (family == AF_INET) {
        auto &in = reinterpret_cast<sockaddr_in &>(ss);
        in.sin_family = AF_INET;
        in.sin_port   = htons(port);
        std::memcpy(&in.sin_addr, bytes, 4);
    } else {
        auto &in6 = reinterpret_cast<sockaddr_in6 &>(ss);
        in6.sin6_family = AF_INET6;
        in6.sin6_port   = htons(port);
        std::memcpy(&in6.sin6_addr, bytes, 16);
    }
    return ss;
}

bool is_local_address(const ip_address &a)
{
    if (a.family == AF_INET && a.bytes[0] == 127) {
        return true;   // 127.0.0.0/8
    }
    static const uint8_t v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    if (a.family == AF_INET6 && std::memcmp(a.bytes, v6_loopback, 16) == 0) {
        return true;
    }
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) {
        return false;
    }
    bool found = false;
    for (ifaddrs *i = list; i && !found; i = i->ifa_next) {
        if (i->ifa_addr && (i->ifa_addr->sa_family == AF_INET ||
                            i->ifa_addr->sa_family == AF_INET6)) {
            auto mine = ip_address::of(*i->ifa_addr);
            found = mine.ok() && *mine == a;
        }
    }
    freeifaddrs(list);
    return found;
}

result<std::unique_ptr<port_space>> port_space::open(const std::string &fabric_name)
{
    // Private to its user, as the fabric (base/private_file.h): another
    // user's table could steer this user's connections to any LID. Only an
    // IP CM with a port on the fabric opens it, so the fabric's last port
    // to leave, which removes it, never leaves a user of the old file.
    const std::string path = fabric::shm_fabric::path_of(fabric_name, ".ipcm.v2");
    auto f = open_private(path, open_how::open_or_create, "IP port space");
    if (!f.ok()) {
        return f.error();
    }
    int fd = f->fd;
    // Growing a fresh file to its size is all the initialisation there is
    // (zeroes = every port free), so racing openers cannot disagree.
    struct stat st {};
    if (fstat(fd, &st) != 0 ||
        (size_t(st.st_size) < table_size && ftruncate(fd, table_size) != 0)) {
        MLX4X_ERROR("cannot size the IP port space %s: %m", path.c_str());
        close(fd);
        return status::shmem_segment;
    }
    void *base = mmap(nullptr, table_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        MLX4X_ERROR("cannot map the IP port space %s: %m", path.c_str());
        return status::shmem_segment;
    }
    return std::unique_ptr<port_space>(new port_space(static_cast<binding *>(base)));
}

port_space::~port_space() { munmap(table_, table_size); }

/// Takes `port` if it is free or its owner is gone: one CAS decides
/// between racing binders.
bool port_space::try_claim(uint16_t port, const ip_address &addr, uint16_t lid)
{
    binding &b = table_[port];
    uint64_t w = b.owner.load(std::memory_order_acquire);
    if (entry_live(b, w) ||
        !b.owner.compare_exchange_strong(w, owner_word(getpid(), claiming),
                                         std::memory_order_acq_rel)) {
        return false;
    }
    b.start_time = process_start_time(getpid());
    std::memcpy(b.addr, addr.bytes, sizeof(b.addr));
    b.family     = addr.family;
    b.lid        = lid;
    b.owner.store(owner_word(getpid(), bound), std::memory_order_release);
    return true;
}

result<uint16_t> port_space::bind(const ip_address &addr, uint16_t port, uint16_t lid)
{
    if (port != 0) {
        return try_claim(port, addr, lid) ? result<uint16_t>(port) : status::busy;
    }
    constexpr unsigned range = ephemeral_last - ephemeral_first + 1;
    unsigned start = std::random_device{}() % range;
    for (unsigned i = 0; i < range; ++i) {
        auto p = uint16_t(ephemeral_first + (start + i) % range);
        if (try_claim(p, addr, lid)) {
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

result<uint16_t> port_space::resolve(const ip_address &addr, uint16_t port) const
{
    if (!is_local_address(addr)) {
        return status::invalid_addr;
    }
    const binding &b = table_[port];
    uint64_t w = b.owner.load(std::memory_order_acquire);
    if (owner_state(w) != bound || !entry_live(b, w)) {
        return status::unreachable;
    }
    // A port bound to "any" address of either family answers every local
    // address (Linux's dual-stack listener); else the address must match.
    ip_address bound_to;
    bound_to.family = sa_family_t(b.family);
    std::memcpy(bound_to.bytes, b.addr, sizeof(b.addr));
    if (!bound_to.any() && !(bound_to == addr)) {
        return status::unreachable;
    }
    return b.lid;
}

} // namespace mlx4x::mad::ip
