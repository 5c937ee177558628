// SPDX-License-Identifier: BSD-3-Clause
#include "hca/fabric/shm_fabric.h"
#include "hca/base/copy.h"
#include "hca/fabric/shm_producer.h"
#include "hca/fabric/shm_region.h"
#include "hca/base/log.h"
#include "hca/base/prefetch.h"
#include "hca/base/process.h"
#include "hca/base/private_file.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

namespace mlx4x::fabric {

using namespace shm;

namespace {

/// Abstract-namespace address of a port's wake-up socket. Abstract names
/// have no owner or mode, so it is named by the fabric's random id, which
/// only processes that can open the segment know: nobody else can take the
/// name first or wake the port. The LID and the attach generation make a
/// datagram never reach a later owner of the same LID.
socklen_t wakeup_address(sockaddr_un &a, const region_header *h, uint32_t lid,
                         uint32_t generation)
{
    a = {};
    a.sun_family = AF_UNIX;
    int n = std::snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1,
                          "mlx4x:%016llx%016llx:%u:%u",
                          static_cast<unsigned long long>(h->fabric_id[0]),
                          static_cast<unsigned long long>(h->fabric_id[1]), lid,
                          generation);
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

int wakeup_socket()
{
    return socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

class mutex_guard {
public:
    explicit mutex_guard(pthread_mutex_t *m) : m_(m)
    {
        if (pthread_mutex_lock(m_) == EOWNERDEAD) {
            // The previous holder died inside the critical section; every
            // update done under this lock is a single-word store, so the
            // table is consistent and can be taken over.
            pthread_mutex_consistent(m_);
        }
    }
    ~mutex_guard() { pthread_mutex_unlock(m_); }
private:
    pthread_mutex_t *m_;
};

/// A slot's stamp. Acquire pairs with the producer's release of the frame
/// bytes.
uint64_t load_stamp(const slot &s) { return s.stamp.load(std::memory_order_acquire); }

/// The frame a published stamp gives. A length beyond the slot (a corrupt
/// or hostile producer) is handed on as an empty frame: the device drops
/// it as malformed and counts it (bad_packets), as a link layer drops a
/// bad packet (IBA 7.9), instead of the fabric losing it without a trace.
std::span<const uint8_t> frame_of(const slot &s, uint64_t stamp)
{
    uint32_t len = stamp_len(stamp);
    return {s.data, len <= slot_data_size ? len : 0};
}

} // namespace

std::string shm_fabric::default_name()
{
    if (const char *n = std::getenv("UCX_MLX4X_FABRIC"); n && *n) {
        return n;
    }
    return "mlx4x-fabric-" + std::to_string(getuid());
}

uint16_t shm_fabric::max_lid() { return static_cast<uint16_t>(max_ports); }

region_header *shm_fabric::hdr() const
{
    return static_cast<region_header *>(base_);
}

status shm_fabric::check_name(const std::string &name)
{
    if (name.empty() || name.size() > max_name_len ||
        name.find('/') != std::string::npos || name == "." || name == "..") {
        MLX4X_ERROR("fabric name '%s' refused: it names a file in /dev/shm, so it "
                    "must be 1 to %zu characters without '/' (UCX_MLX4X_FABRIC)",
                    name.c_str(), max_name_len);
        return status::invalid_param;
    }
    return status::ok;
}

std::string shm_fabric::path_of(const std::string &name, const char *suffix)
{
    return "/dev/shm/" + name + suffix;
}

result<std::unique_ptr<shm_fabric>> shm_fabric::open(const std::string &name,
                                                     options opts)
{
    if (status s = check_name(name); s != status::ok) {
        return s;
    }
    auto m = map_segment(name, opts.how);
    if (!m.ok()) {
        return m.error();
    }
    return std::unique_ptr<shm_fabric>(new shm_fabric(name, *m, opts));
}

/// Maps /dev/shm/<name>, creating and initialising it when `how` allows and
/// it is missing, or was left unusable by a creator that died or by another
/// mlx4x version with nobody attached.
namespace {

/// A segment someone else created: waits (at most 2 s) until its creator
/// has sized and initialised it. Returns its magic (0: never initialised)
/// and, in `size`, its size from the descriptor: the name may point
/// elsewhere by now.
uint64_t wait_for_creator(int fd, region_header *h, size_t &size)
{
    auto size_of = [fd] {
        struct stat now {};
        return fstat(fd, &now) == 0 ? size_t(now.st_size) : size_t(0);
    };
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    uint64_t magic = 0;
    while (true) {
        if (size_of() >= sizeof(region_header)) {
            magic = std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire);
            if (magic != 0) {
                break;
            }
        }
        if (std::chrono::steady_clock::now() > deadline) {
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    size = size_of();
    return magic;
}

} // namespace

result<shm_fabric::mapping> shm_fabric::map_segment(const std::string &name, open_how how)
{
    const std::string path = path_of(name);
    for (int attempt = 0; attempt < 2; ++attempt) {
        auto f = open_private(path, how, "fabric segment");
        if (!f.ok()) {
            return f.error();
        }
        int fd = f->fd;
        if (f->created && ftruncate(fd, total_size) != 0) {
            MLX4X_ERROR("cannot size fabric segment %s: %m", path.c_str());
            close(fd);
            unlink(path.c_str());
            return status::shmem_segment;
        }
        // A creator that has not sized the file yet is waited for below;
        // mapping beyond the current size is fine until it is touched.
        void *base = mmap(nullptr, total_size, PROT_READ | PROT_WRITE,
                          MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) {
            MLX4X_ERROR("cannot map fabric segment %s: %m", path.c_str());
            close(fd);
            return status::shmem_segment;
        }
        auto *h = static_cast<region_header *>(base);
        mapping m{base, {}};
        (void)fstat(fd, &m.file);
        if (f->created) {
            close(fd);
            init_region(h);
            return m;
        }
        size_t   size  = 0;
        uint64_t magic = wait_for_creator(fd, h, size);
        close(fd);
        if (magic == region_magic && size == total_size && layout_matches(h)) {
            return m;
        }
        bool abandoned = magic == region_magic && !layout_matches(h) &&
                         nobody_attached(h, size);
        munmap(base, total_size);
        if (how == open_how::open_existing) {
            // Not ours to repair: a diagnostic tool only looks.
        } else if (abandoned && attempt == 0) {
            // Left by another mlx4x version and no live process attached:
            // nobody can be using it.
            MLX4X_WARN("fabric segment %s has another layout and no live ports, "
                       "recreating it", path.c_str());
            unlink(path.c_str());
            continue;
        } else if (magic == 0 && attempt == 0) {
            // Its creator died before initialising it: nobody can be using
            // it, so start over with a fresh segment.
            MLX4X_WARN("fabric segment %s was never initialised (creator "
                       "died?), recreating it", path.c_str());
            unlink(path.c_str());
            continue;
        }
        MLX4X_ERROR("%s is not an mlx4x v%u fabric segment (corrupt, or left by "
                    "another mlx4x version); remove it with 'rm %s' when no mlx4x "
                    "job is running, or choose another fabric with UCX_MLX4X_FABRIC",
                    path.c_str(), region_version, path.c_str());
        return status::shmem_segment;
    }
    return status::shmem_segment;
}

shm_fabric::~shm_fabric() { munmap(base_, total_size); }

// ---------------------------------------------------------------------------

class shm_fabric::shm_port final : public port, private shm::producer {
public:
    shm_port(region_header *h, const std::string &fabric, const struct stat &file,
             uint32_t index, uint64_t guid, std::unique_ptr<uint64_t> probe,
             const options &opts)
        : producer(ports(h), rings(h), capture(h)), h_(h), fabric_(fabric), file_(file), index_(index),
          guid_(guid), probe_(std::move(probe)), single_copy_min_(opts.single_copy_min),
          single_copy_try_min_(opts.single_copy_try_min)
    {
        // The port's interrupt line; without it the owner never sleeps.
        // Both sockets are made here, in the network namespace the port
        // is opened in: their abstract addresses are that namespace's, and
        // a thread that sends later may be in another (UCX_MLX4X_NETNS).
        wake_rx_ = wakeup_socket();
        wake_tx_ = wakeup_socket();
        sockaddr_un a;
        socklen_t   len = wakeup_address(a, h_, lid(), ports_[index_].generation);
        if (wake_rx_ >= 0 && bind(wake_rx_, reinterpret_cast<sockaddr *>(&a), len) != 0) {
            MLX4X_WARN("fabric %s lid %u: no wake-up socket (%m); the port "
                       "cannot sleep", fabric_.c_str(), lid());
            close(wake_rx_);
            wake_rx_ = -1;
        }
    }

    ~shm_port() override
    {
        if (wake_rx_ >= 0) close(wake_rx_);
        if (wake_tx_ >= 0) close(wake_tx_);
        mutex_guard g(&h_->lock);
        port_entry &e = ports_[index_];
        for (auto &g : e.multicast) {
            g.store(0, std::memory_order_relaxed);
        }
        e.released = uint64_t(std::chrono::steady_clock::now().time_since_epoch() /
                              std::chrono::nanoseconds(1));
        e.pid = 0;
        e.probe_va = 0;
        e.state.store(static_cast<uint32_t>(port_state::free),
                      std::memory_order_release);
        if (!any_live_port(h_)) {
            remove_files();
        }
    }

    uint16_t lid() const override { return static_cast<uint16_t>(index_ + 1); }
    uint64_t port_guid() const override { return guid_; }

    status send(std::span<const uint8_t> hdr,
                std::span<const uint8_t> payload) override
    {
        uint16_t dlid = frame_dlid(hdr);
        if (ib::is_multicast_lid(dlid)) {
            send_multicast(dlid, hdr, payload);
            return status::ok;
        }
        return send_in_place(dlid, hdr, payload);
    }

    status join_multicast(uint16_t mlid) override
    {
        if (!ib::is_multicast_lid(mlid)) {
            return status::invalid_param;
        }
        auto &groups = ports_[index_].multicast;
        for (auto &g : groups) {
            if (g.load(std::memory_order_relaxed) == mlid) {
                return status::ok;
            }
        }
        for (auto &g : groups) {
            uint16_t expected = 0;
            if (g.compare_exchange_strong(expected, mlid, std::memory_order_release)) {
                return status::ok;
            }
        }
        return status::exceeds_limit;
    }

    void leave_multicast(uint16_t mlid) override
    {
        for (auto &g : ports_[index_].multicast) {
            uint16_t expected = mlid;
            g.compare_exchange_strong(expected, 0, std::memory_order_release);
        }
    }

private:
    /// A copy to every other live member; a full ring misses it (UD).
    void send_multicast(uint16_t mlid, std::span<const uint8_t> hdr,
                        std::span<const uint8_t> payload)
    {
        for (uint32_t i = 0; i < max_ports; ++i) {
            const port_entry &e = ports_[i];
            if (i == index_ || e.state.load(std::memory_order_acquire) !=
                                   static_cast<uint32_t>(port_state::active)) {
                continue;
            }
            for (const auto &g : e.multicast) {
                if (g.load(std::memory_order_acquire) == mlid) {
                    (void)send_in_place(uint16_t(i + 1), hdr, payload);
                    break;
                }
            }
        }
    }


public:
    status reserve(uint16_t dlid, size_t len, frame_slot &f) override
    {
        return producer::reserve(dlid, len, f);
    }
    status commit(const frame_slot &f) override { return producer::commit(f); }
    shm::producer *shm_producer() override { return this; }

    bool sends_concurrently() const override { return true; }

    /// Uses the rings' atomics only, none of the port's per-destination
    /// caches (what a full ring was last seen as, the liveness checks), and
    /// the wake-up socket with one sendto: safe next to the owner's sends.
    status send_concurrent(std::span<const uint8_t> frame) override
    {
        if (frame.size() < 4) {
            return status::invalid_param;
        }
        uint16_t dlid = frame_dlid(frame);
        if (dlid == 0 || dlid > max_ports) {
            return status::unreachable;
        }
        owner_view fresh;   // generation 0: read the owner's head afresh
        frame_slot f;
        if (status s = claim(dlid, frame.size(), f, fresh, false); s != status::ok) {
            return s;
        }
        copy_bytes(f.data, frame.data(), frame.size());
        publish(f);
        if (f.wake) {
            wake(dlid, ports_[dlid - 1].generation);   // one sendto: safe from two threads
        }
        return status::ok;
    }

public:
    int wakeup_fd() const override { return wake_rx_; }

    bool arm_wakeup() override
    {
        if (wake_rx_ < 0) {
            return false;
        }
        char buf[16];
        while (recv(wake_rx_, buf, sizeof(buf), 0) > 0) {
        }
        // Armed only while every claimed frame has been taken (tail ==
        // taken_): a frame claimed before the arm is handled first, and every
        // later claim sees the armed bit in the same word (one CAS order,
        // no fence pairing between the two sides, as UCX's mm FIFO).
        ring &r = rings_[index_];
        uint64_t tail = r.tail.load(std::memory_order_relaxed);
        do {
            if ((tail & ~ring_tail_armed) != taken_) {
                return false;   // a frame is here or on its way
            }
        } while (!(tail & ring_tail_armed) &&
                 !r.tail.compare_exchange_weak(tail, tail | ring_tail_armed,
                                               std::memory_order_acq_rel));
        return true;
    }

    bool frame_waiting() const override
    {
        return stamp_publishes(load_stamp(rings_[index_].slots[taken_ & (ring_slots - 1)]), taken_);
    }

    bool peek(std::span<const uint8_t> &frame) const override
    {
        const slot &s = rings_[index_].slots[taken_ & (ring_slots - 1)];
        uint64_t    st = load_stamp(s);
        if (!stamp_publishes(st, taken_)) {
            return false;
        }
        frame = frame_of(s, st);
        return true;
    }

    unsigned poll(frame_sink &sink, unsigned budget) override
    {
        ring &r = rings_[index_];
        unsigned n = 0;
        while (n < budget) {
            slot    &s  = r.slots[taken_ & (ring_slots - 1)];
            uint64_t st = load_stamp(s);
            if (!stamp_publishes(st, taken_)) {
                break;
            }
            std::span<const uint8_t> frame = frame_of(s, st);
            // The next slot's lines, as many as this frame's, while this
            // frame is handled: no hardware prefetcher fetches them, and a
            // receiver a few frames behind then waits for one transfer
            // between cores per line instead of overlapping them
            // (docs/benchmarks.md, "Measured reasons in the code"; "Small
            // frames in one line"). Not yet written, the lines were going
            // to be read next anyway.
            prefetch_slot<prefetch_for_read>(r.slots[(taken_ + 1) & (ring_slots - 1)],
                                             frame.size());
            bool more = sink.on_frame(frame);
            ++taken_;
            ++n;
            if (!more) {
                break;
            }
        }
        return n;
    }

    void release() override
    {
        // Release order: our reads of the slots happen before producers
        // reuse them (they read head, never a slot, to see it free).
        ring &r = rings_[index_];
        if (r.head.load(std::memory_order_relaxed) != taken_) {
            r.head.store(taken_, std::memory_order_release);
        }
    }

    bool peer_alive(uint16_t lid) const override
    {
        if (lid == 0 || lid > max_ports) {
            return false;
        }
        const port_entry &e = ports_[lid - 1];
        return e.state.load(std::memory_order_acquire) ==
                   static_cast<uint32_t>(port_state::active) &&
               owner_alive(e);
    }

    bool lossless(uint16_t) const override { return true; }

    bool delivered(uint16_t lid) const override
    {
        // The ring's owner moves head past the frames it has released.
        return lid != 0 && lid <= max_ports &&
               rings_[lid - 1].head.load(std::memory_order_acquire) >=
                   sent_upto_[lid - 1];
    }

    uint64_t direct_min(uint16_t lid) override
    {
        return single_copy_min_ && can_reach(lid) ? single_copy_min_ : 0;
    }

    uint64_t direct_try_min(uint16_t lid) override
    {
        return single_copy_try_min_ && direct_min(lid) ? single_copy_try_min_ : 0;
    }

    /// process_vm_readv/writev with the pid the caller's connection named:
    /// the port table's pid (another process's writing) only answers
    /// whether to try (can_reach).
    status direct_copy(direct_peer peer, copy_dir dir, std::span<const mem_range> local,
                       std::span<const mem_range> remote) override
    {
        constexpr size_t max_ranges = 64;
        if (peer.pid <= 0 || local.size() > max_ranges || remote.size() > max_ranges) {
            return status::unsupported;
        }
        iovec liov[max_ranges], riov[max_ranges];
        uint64_t ltotal = to_iovecs(local, liov), rtotal = to_iovecs(remote, riov);
        if (ltotal != rtotal) {
            return status::unsupported;
        }
        ssize_t n = dir == copy_dir::from_peer
                        ? process_vm_readv(peer.pid, liov, local.size(), riov, remote.size(), 0)
                        : process_vm_writev(peer.pid, liov, local.size(), riov, remote.size(), 0);
        if (n != ssize_t(rtotal)) {
            MLX4X_DEBUG("fabric %s: single copy %s lid %u (pid %d) failed: %s",
                        fabric_.c_str(), dir == copy_dir::from_peer ? "from" : "to",
                        peer.lid, int(peer.pid), n < 0 ? std::strerror(errno) : "partial");
            return status::unsupported;
        }
        return status::ok;
    }

private:
    static uint64_t to_iovecs(std::span<const mem_range> ranges, iovec *out)
    {
        uint64_t total = 0;
        for (size_t i = 0; i < ranges.size(); ++i) {
            out[i] = {reinterpret_cast<void *>(static_cast<uintptr_t>(ranges[i].addr)),
                      ranges[i].len};
            total += ranges[i].len;
        }
        return total;
    }

    /// Whether this process can reach the memory of the owner of `lid`:
    /// reading the owner's probe word through process_vm_readv answers every
    /// reason it might not (another user, a ptrace restriction such as Yama,
    /// a seccomp filter). Asked once per attach generation of the LID.
    bool can_reach(uint16_t lid)
    {
        if (lid == 0 || lid > max_ports) {
            return false;
        }
        const port_entry &e = ports_[lid - 1];
        reach &r = reach_[lid - 1];
        uint32_t gen = e.generation;
        if (r.generation != gen || !r.known) {
            uint64_t word = 0;
            iovec    l{&word, sizeof(word)};
            iovec    rem{reinterpret_cast<void *>(static_cast<uintptr_t>(e.probe_va)),
                         sizeof(word)};
            r.ok = e.probe_va &&
                   process_vm_readv(e.pid, &l, 1, &rem, 1, 0) == ssize_t(sizeof(word)) &&
                   word == e.port_guid;
            r.known      = true;
            r.generation = gen;
        }
        return r.ok;
    }

    /// A full ring whose owner died is never drained: its frames are lost
    /// on the wire, as on a link to a dead node, so the sender's transport
    /// (retries, then an error) takes over instead of pushing for ever.
    /// Checked at most once per millisecond per destination: it costs
    /// system calls, and a live but busy owner is the common case.
    bool owner_gone(uint16_t dlid, const port_entry &e) override
    {
        uint64_t now = uint64_t(std::chrono::steady_clock::now().time_since_epoch() /
                                std::chrono::microseconds(1));
        uint64_t &last = last_liveness_check_us_[dlid - 1];
        if (now - last < 1000) {
            return gone_[dlid - 1];
        }
        last = now;
        gone_[dlid - 1] = !owner_alive(e);
        return gone_[dlid - 1];
    }

    /// One datagram to a sleeping port's wake-up socket; a full socket
    /// buffer already holds a wake-up, so EAGAIN is fine.
    void wake(uint16_t dlid, uint32_t generation) override
    {
        if (wake_tx_ >= 0) {
            send_wakeup(wake_tx_, dlid, generation);
        }
    }

    void send_wakeup(int fd, uint16_t dlid, uint32_t generation) const
    {
        sockaddr_un a;
        socklen_t   len = wakeup_address(a, h_, dlid, generation);
        char        one = 1;
        (void)sendto(fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                     reinterpret_cast<sockaddr *>(&a), len);
    }

    /// The fabric's last port leaves: its files go (nothing is left in
    /// /dev/shm), and a process that mapped the segment before maps the
    /// name again at its next attach (region_header::closed). Called with
    /// the lock held. Only the segment this port is on is removed: the name
    /// may name a newer one if a user removed this one by hand.
    void remove_files()
    {
        h_->closed = 1;
        struct stat st {};
        if (stat(shm_fabric::path_of(fabric_).c_str(), &st) == 0 &&
            st.st_dev == file_.st_dev && st.st_ino == file_.st_ino) {
            unlink(shm_fabric::path_of(fabric_).c_str());
            unlink(shm_fabric::path_of(fabric_, ".ipcm.v2").c_str());
            unlink(shm_fabric::path_of(fabric_, ".sm").c_str());
        }
    }

    region_header *h_;
    std::string    fabric_;
    struct stat    file_;   ///< the segment's file (device and inode)
    uint32_t       index_;
    uint64_t       guid_;
    int            wake_rx_ = -1;   ///< bound: this port's interrupt line
    int            wake_tx_ = -1;   ///< unbound: wakes other ports
    uint64_t       last_liveness_check_us_[max_ports] = {};
    bool           gone_[max_ports] = {};
    uint64_t       taken_ = 0;   ///< our ring's next frame (head: the next not released)
    std::unique_ptr<uint64_t> probe_;   ///< holds guid_; port_entry.probe_va
    uint64_t       single_copy_min_;
    uint64_t       single_copy_try_min_;
    struct reach {
        uint32_t generation = 0;
        bool     known = false, ok = false;
    };
    reach          reach_[max_ports];
};

shm::capture_ring &shm_fabric::mirror() { return *capture(hdr()); }

uint64_t shm_fabric::fabric_id() const { return hdr()->fabric_id[0] ^ hdr()->fabric_id[1]; }

result<std::unique_ptr<port>> shm_fabric::attach()
{
    // The fabric's last port removed its files after this process mapped
    // them: the name is mapped again (created anew if nobody did yet). A
    // few rounds at most, unless other processes keep opening and closing
    // the fabric in step with this one.
    for (int round = 0; round < 8; ++round) {
        {
            mutex_guard g(&hdr()->lock);
            if (!hdr()->closed) {
                return attach_locked();
            }
        }
        auto m = map_segment(name_, opts_.how);
        if (!m.ok()) {
            return m.error();
        }
        munmap(base_, total_size);   // no port of this process is on it
        base_ = m->base;
        file_ = m->file;
    }
    MLX4X_ERROR("fabric %s: closed and reopened by other processes at every try",
                name_.c_str());
    return status::busy;
}

result<std::unique_ptr<port>> shm_fabric::attach_locked()
{
    region_header *h = hdr();
    port_entry    *tab = ports(h);
    // The free port that has been free longest. Ports of processes that died
    // without detaching are reclaimed only when no free one is left: their
    // peers' connections see them dead (peer_alive) instead of reaching a
    // new owner, and time out cleanly.
    auto longest_free = [&]() -> port_entry * {
        port_entry *best = nullptr;
        for (uint32_t i = 0; i < max_ports; ++i) {
            if (tab[i].state.load(std::memory_order_acquire) ==
                    static_cast<uint32_t>(port_state::free) &&
                (!best || tab[i].released < best->released)) {
                best = &tab[i];
            }
        }
        return best;
    };
    port_entry *free_port = longest_free();
    if (!free_port) {
        for (uint32_t i = 0; i < max_ports; ++i) {
            if (!owner_alive(tab[i])) {
                MLX4X_DEBUG("reclaiming lid %u of dead process %d", i + 1, tab[i].pid);
                tab[i].state.store(static_cast<uint32_t>(port_state::free),
                                   std::memory_order_release);
            }
        }
        free_port = longest_free();
    }
    if (free_port) {
        port_entry &e = *free_port;
        uint32_t    i = uint32_t(free_port - tab);
        e.state.store(static_cast<uint32_t>(port_state::attaching),
                      std::memory_order_relaxed);
        e.pid        = getpid();
        e.start_time = process_start_time(e.pid);
        e.port_guid  = port_guid_of(h->next_guid++);
        ++e.generation;
        for (auto &grp : e.multicast) {   // a dead owner's groups end with it
            grp.store(0, std::memory_order_relaxed);
        }
        auto probe = std::make_unique<uint64_t>(e.port_guid);
        e.probe_va = reinterpret_cast<uintptr_t>(probe.get());
        ring &r = rings(h)[i];
        map_ring(r);
        for (uint32_t sl = 0; sl < ring_slots; ++sl) {
            // As if published for position sl - 1: not yet for sl.
            r.slots[sl].stamp.store(stamp_of(uint64_t{sl} - 1, 0), std::memory_order_relaxed);
        }
        r.head.store(0, std::memory_order_relaxed);
        r.tail.store(0, std::memory_order_relaxed);
        // Ring reset is visible before any sender sees the port active.
        e.state.store(static_cast<uint32_t>(port_state::active),
                      std::memory_order_release);
        return std::unique_ptr<port>(new shm_port(h, name_, file_, i, e.port_guid,
                                                  std::move(probe), opts_));
    }
    MLX4X_ERROR("fabric %s is full: %u ports in use", name_.c_str(), max_ports);
    return status::exceeds_limit;
}

} // namespace mlx4x::fabric
