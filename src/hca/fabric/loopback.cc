// SPDX-License-Identifier: BSD-3-Clause
#include "hca/fabric/loopback.h"

#include <algorithm>
#include <cstring>
#include <unistd.h>

namespace mlx4x::fabric {

class loopback_fabric::lb_port final : public port {
public:
    lb_port(loopback_fabric &f, uint16_t lid) : fabric_(f), lid_(lid) {}
    ~lb_port() override
    {
        fabric_.queues_.erase(lid_);
        fabric_.unreleased_.erase(lid_);
        for (auto &[mlid, members] : fabric_.groups_) {
            members.erase(lid_);
        }
    }

    uint16_t lid() const override { return lid_; }
    uint64_t port_guid() const override { return port_guid_of(lid_); }

    status send(std::span<const uint8_t> hdr,
                std::span<const uint8_t> payload) override
    {
        std::vector<uint8_t> frame;
        frame.reserve(hdr.size() + payload.size());
        frame.insert(frame.end(), hdr.begin(), hdr.end());
        frame.insert(frame.end(), payload.begin(), payload.end());
        uint16_t dlid = frame_dlid(hdr);
        if (ib::is_multicast_lid(dlid)) {
            fabric_.deliver_multicast(dlid, lid_, frame);
            return status::ok;
        }
        return fabric_.deliver(dlid, std::move(frame));
    }

    status join_multicast(uint16_t mlid) override
    {
        if (!ib::is_multicast_lid(mlid)) {
            return status::invalid_param;
        }
        fabric_.groups_[mlid].insert(lid_);
        return status::ok;
    }

    void leave_multicast(uint16_t mlid) override { fabric_.groups_[mlid].erase(lid_); }

    unsigned poll(frame_sink &sink, unsigned budget) override
    {
        fabric_.release_delayed();
        unsigned n = 0;
        while (n < budget) {
            auto it = fabric_.queues_.find(lid_);
            if (it == fabric_.queues_.end() || it->second.empty()) {
                break;
            }
            std::vector<uint8_t> frame = std::move(it->second.front());
            it->second.pop_front();
            ++n;
            if (!sink.on_frame(frame)) {
                break;
            }
        }
        if (n) {
            fabric_.unreleased_[lid_] += n;
        }
        return n;
    }

    void release() override { fabric_.unreleased_.erase(lid_); }
    /// Exact, as the shm fabric's is: a quiet device polls only when told
    /// (frames held back for delivery later count: poll() moves them).
    bool frame_waiting() const override
    {
        auto it = fabric_.queues_.find(lid_);
        return !fabric_.held_.empty() || (it != fabric_.queues_.end() && !it->second.empty());
    }

    bool peer_alive(uint16_t lid) const override
    {
        return fabric_.queues_.count(lid) != 0;
    }

    bool delivered(uint16_t lid) const override
    {
        auto it = fabric_.queues_.find(lid);
        return it != fabric_.queues_.end() && it->second.empty() &&
               !fabric_.unreleased_.count(lid);
    }

    bool lossless(uint16_t) const override
    {
        const fault_plan &p = fabric_.plan_;
        return !p.drop_one_in && !p.duplicate_one_in && !p.reorder_one_in &&
               !p.delay_one_in;
    }

    uint64_t direct_min(uint16_t lid) override
    {
        return fabric_.queues_.count(lid) ? fabric_.direct_min_ : 0;
    }

    uint64_t direct_try_min(uint16_t lid) override
    {
        return direct_min(lid) ? fabric_.direct_try_min_ : 0;
    }

    /// In-process: the pid must be this process's, as the connection
    /// named it; the ranges are copied pairwise in order.
    status direct_copy(direct_peer peer, copy_dir dir, std::span<const mem_range> local,
                       std::span<const mem_range> remote) override
    {
        if (!direct_min(peer.lid) || fabric_.direct_refuse_ || peer.pid != getpid() ||
            (dir == copy_dir::from_peer && fabric_.from_peer_fails_ == lid_)) {
            return status::unsupported;
        }
        auto total = [](std::span<const mem_range> rs) {
            uint64_t n = 0;
            for (const mem_range &r : rs) n += r.len;
            return n;
        };
        if (total(local) != total(remote)) {
            return status::unsupported;
        }
        size_t li = 0, ri = 0;
        uint64_t lo = 0, ro = 0;
        while (li < local.size() && ri < remote.size()) {
            uint64_t n = std::min(local[li].len - lo, remote[ri].len - ro);
            auto *l = reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(local[li].addr + lo));
            auto *r = reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(remote[ri].addr + ro));
            if (n) {
                dir == copy_dir::from_peer ? std::memmove(l, r, n) : std::memmove(r, l, n);
            }
            lo += n;
            ro += n;
            if (lo == local[li].len) { ++li; lo = 0; }
            if (ri < remote.size() && ro == remote[ri].len) { ++ri; ro = 0; }
        }
        return status::ok;
    }

private:
    loopback_fabric &fabric_;
    uint16_t         lid_;
};

result<std::unique_ptr<port>> loopback_fabric::attach()
{
    uint16_t lid = next_lid_++;
    queues_[lid];
    return std::unique_ptr<port>(new lb_port(*this, lid));
}

bool loopback_fabric::hit(unsigned one_in)
{
    if (!one_in) {
        return false;
    }
    // xorshift64: cheap, seeded, reproducible.
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return rng_ % one_in == 0;
}

void loopback_fabric::release_delayed()
{
    std::erase_if(held_, [this](held_frame &h) {
        if (--h.polls_left) {
            return false;
        }
        if (auto it = queues_.find(h.dlid); it != queues_.end()) {
            it->second.push_back(std::move(h.frame));
        }
        return true;
    });
}

void loopback_fabric::deliver_multicast(uint16_t mlid, uint16_t from,
                                        const std::vector<uint8_t> &frame)
{
    auto it = groups_.find(mlid);
    if (it == groups_.end()) {
        return;
    }
    for (uint16_t member : it->second) {
        if (member != from) {
            (void)deliver(member, std::vector<uint8_t>(frame));   // full: missed
        }
    }
}

status loopback_fabric::deliver(uint16_t dlid, std::vector<uint8_t> &&frame)
{
    auto it = queues_.find(dlid);
    if (it == queues_.end()) {
        return status::unreachable;
    }
    auto &q = it->second;
    auto   held = unreleased_.find(dlid);
    size_t room_taken = q.size() + (held != unreleased_.end() ? held->second : 0);
    if (room_taken >= plan_.queue_capacity) {
        return status::no_resource;
    }
    ++sent_;
    if (record_) {
        record_->push_back(frame);
    }
    if (hit(plan_.drop_one_in)) {
        ++dropped_;
        return status::ok;        // lost on the wire: the sender cannot tell
    }
    if (hit(plan_.duplicate_one_in)) {
        q.push_back(frame);
    }
    if (hit(plan_.delay_one_in)) {
        held_.push_back({dlid, std::max(1u, plan_.delay_polls), std::move(frame)});
        return status::ok;
    }
    q.push_back(std::move(frame));
    if (hit(plan_.reorder_one_in) && q.size() >= 2) {
        std::swap(q[q.size() - 1], q[q.size() - 2]);
    }
    return status::ok;
}

} // namespace mlx4x::fabric
