// SPDX-License-Identifier: BSD-3-Clause
// Multicast groups (IBA 10.5.2.3 / 11.3.1; seeds C14, C51, E70): the
// firmware's MCG table as mlx4 has it (MGID_HASH, READ_MCG, WRITE_MCG; the
// driver keeps the hash chains), and UD delivery to every QP attached to
// the group a packet's multicast DLID names.
#include "hca/dev/device.h"
#include "hca/engine/pkt.h"

#include <cstring>

namespace mlx4x::dev {

using prm::cmd_status;

namespace {

/// Entries indexed by MGID_HASH: the first half (the rest is the AMGM).
constexpr uint32_t hash_entries = (1u << limits::log_max_mcg) / 2;

} // namespace

cmd_status device::cmd_mgid_hash(uint64_t inbox, uint64_t &hash)
{
    // FNV-1a over the 16 MGID bytes; any fixed function will do, the
    // driver only uses the result as the head of a chain.
    const uint8_t *gid = dma<uint8_t>(inbox);
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; ++i) {
        h = (h ^ gid[i]) * 16777619u;
    }
    hash = h % hash_entries;
    return cmd_status::ok;
}

cmd_status device::cmd_read_mcg(uint32_t index, uint64_t outbox)
{
    if (index >= mcg_.size()) {
        return cmd_status::bad_index;
    }
    std::memcpy(dma<void>(outbox), &mcg_[index], sizeof(prm::mgm_entry));
    return cmd_status::ok;
}

cmd_status device::cmd_write_mcg(uint32_t index, uint64_t inbox)
{
    if (index >= mcg_.size()) {
        return cmd_status::bad_index;
    }
    prm::mgm_entry e;
    std::memcpy(&e, dma<void>(inbox), sizeof(e));
    uint32_t members = e.members_count.get() & prm::mgm_qpn_mask;
    uint32_t next    = e.next_gid_index.get() >> prm::mgm_next_shift;
    if (members > (1u << limits::log_max_qp_per_mcg) || next >= mcg_.size() ||
        (members && !ib::is_multicast_lid(e.mlid.get()))) {
        return cmd_status::bad_param;
    }
    mcg_[index] = e;
    update_multicast();
    return cmd_status::ok;
}

/// Rebuilds MLID -> QPNs from the table and tells the fabric which groups
/// the port belongs to (what an SA join and the SM would arrange).
void device::update_multicast()
{
    std::map<uint16_t, std::vector<uint32_t>> members;
    for (const prm::mgm_entry &e : mcg_) {
        uint32_t n = e.members_count.get() & prm::mgm_qpn_mask;
        for (uint32_t i = 0; i < n; ++i) {
            members[e.mlid.get()].push_back(e.qp[i].get() & prm::mgm_qpn_mask);
        }
    }
    if (port_) {
        for (const auto &[mlid, qpns] : mcast_members_) {
            if (!members.count(mlid)) {
                port_->leave_multicast(mlid);
            }
        }
        for (const auto &[mlid, qpns] : members) {
            if (!mcast_members_.count(mlid)) {
                (void)port_->join_multicast(mlid);
            }
        }
    }
    mcast_members_ = std::move(members);
}

/// A multicast packet (IBA 10.5.2.3: UD only, BTH DestQP 0xFFFFFF) goes to
/// every attached QP that admits it, each with its own Q_Key check.
void device::receive_multicast(const engine::pkt &p)
{
    auto it = mcast_members_.find(p.dlid);
    if (!(p.info->kind & ib::kind_ud) || p.dest_qp != ib::multicast_qpn ||
        it == mcast_members_.end()) {
        count(counter::bad_packets);
        return;
    }
    count(counter::rx_multicast);
    for (uint32_t qpn : it->second) {
        if (qp *q = find_qp(qpn); q && admits(*q, p)) {
            respond_ud(*q, p);
        }
    }
}

/// The fabric sends a multicast frame to the other member ports only; the
/// sending HCA delivers it to its own attached QPs (mlx4 without
/// multicast loopback blocking).
void device::loop_back_multicast(std::span<const uint8_t> hdr,
                                 std::span<const uint8_t> payload)
{
    if (!mcast_members_.count(fabric::frame_dlid(hdr)) ||
        hdr.size() + payload.size() > loopback_frame_.size()) {
        return;
    }
    std::memcpy(loopback_frame_.data(), hdr.data(), hdr.size());
    std::memcpy(loopback_frame_.data() + hdr.size(), payload.data(), payload.size());
    (void)on_frame({loopback_frame_.data(), hdr.size() + payload.size()});
}

} // namespace mlx4x::dev
