// SPDX-License-Identifier: BSD-3-Clause
#include "hca/fabric/loopback.h"

#include <algorithm>

namespace mlx4x::fabric {

class loopback_fabric::lb_port final : public port {
public:
    lb_port(loopback_fabric &f, uint16_t lid) : fabric_(f), lid_(lid) {}
    ~lb_port() override { fabric_.queues_.erase(lid_); }

    uint16_t lid() const override { return lid_; }
    uint64_t port_guid() const override { return 0x0002c90300000000ull | lid_; }

    status send(std::span<const uint8_t> hdr,
                std::span<const uint8_t> payload) override
    {
        std::vector<uint8_t> frame;
        frame.reserve(hdr.size() + payload.size());
        frame.insert(frame.end(), hdr.begin(), hdr.end());
        frame.insert(frame.end(), payload.begin(), payload.end());
        return fabric_.deliver(frame_dlid(hdr), std::move(frame));
    }

    unsigned poll(frame_sink &sink, unsigned budget) override
    {
        unsigned n = 0;
        while (n < budget) {
            auto it = fabric_.queues_.find(lid_);
            if (it == fabric_.queues_.end() || it->second.empty()) {
                break;
            }
            std::vector<uint8_t> frame = std::move(it->second.front());
            it->second.pop_front();
            sink.on_frame(frame);
            ++n;
        }
        return n;
    }

    bool peer_alive(uint16_t lid) const override
    {
        return fabric_.queues_.count(lid) != 0;
    }

    bool lossless() const override
    {
        const fault_plan &p = fabric_.plan_;
        return !p.drop_every && !p.duplicate_every && !p.reorder_every;
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

status loopback_fabric::deliver(uint16_t dlid, std::vector<uint8_t> &&frame)
{
    auto it = queues_.find(dlid);
    if (it == queues_.end()) {
        return status::unreachable;
    }
    auto &q = it->second;
    if (q.size() >= plan_.queue_capacity) {
        return status::no_resource;
    }
    uint64_t n = ++sent_;
    if (plan_.drop_every && n % plan_.drop_every == 0) {
        ++dropped_;
        return status::ok;        // lost on the wire: the sender cannot tell
    }
    if (plan_.duplicate_every && n % plan_.duplicate_every == 0) {
        q.push_back(frame);
    }
    q.push_back(std::move(frame));
    if (plan_.reorder_every && n % plan_.reorder_every == 0 && q.size() >= 2) {
        std::swap(q[q.size() - 1], q[q.size() - 2]);
    }
    return status::ok;
}

} // namespace mlx4x::fabric
