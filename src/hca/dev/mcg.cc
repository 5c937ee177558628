// SPDX-License-Identifier: BSD-3-Clause
// Multicast groups (IBA 10.5.2.3 / 11.3.1; seeds C14, C51, E70): the
// firmware's MCG table as mlx4 has it (MGID_HASH, READ_MCG, WRITE_MCG; the
// driver keeps the hash chains), decoded at every WRITE_MCG into the
// members ingress delivers a multicast packet to (ingress.cc).
#include "hca/dev/firmware.h"
#include "hca/engine/pkt.h"

#include <cstring>

namespace mlx4x::dev {

using prm::cmd_status;

namespace {

/// Entries indexed by MGID_HASH: the first half (the rest is the AMGM).
constexpr uint32_t hash_entries = (1u << limits::log_max_mcg) / 2;

} // namespace

cmd_status firmware::cmd_mgid_hash(uint64_t inbox, uint64_t &hash)
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

cmd_status firmware::cmd_read_mcg(uint32_t index, uint64_t outbox)
{
    if (index >= hca_.mcg_.size()) {
        return cmd_status::bad_index;
    }
    std::memcpy(dma<void>(outbox), &hca_.mcg_[index], sizeof(prm::mgm_entry));
    return cmd_status::ok;
}

cmd_status firmware::cmd_write_mcg(uint32_t index, uint64_t inbox)
{
    if (index >= hca_.mcg_.size()) {
        return cmd_status::bad_index;
    }
    prm::mgm_entry e;
    std::memcpy(&e, dma<void>(inbox), sizeof(e));
    uint32_t members = e.members_count.get() & prm::mgm_qpn_mask;
    uint32_t next    = e.next_gid_index.get() >> prm::mgm_next_shift;
    if (members > (1u << limits::log_max_qp_per_mcg) || next >= hca_.mcg_.size() ||
        (members && !ib::is_multicast_lid(e.mlid.get()))) {
        return cmd_status::bad_param;
    }
    hca_.mcg_[index] = e;
    update_multicast();
    return cmd_status::ok;
}

/// Rebuilds MLID -> QPNs from the table and tells the fabric which groups
/// the port belongs to (what an SA join and the SM would arrange).
void firmware::update_multicast()
{
    std::map<uint16_t, std::vector<uint32_t>> members;
    for (const prm::mgm_entry &e : hca_.mcg_) {
        uint32_t n = e.members_count.get() & prm::mgm_qpn_mask;
        for (uint32_t i = 0; i < n; ++i) {
            members[e.mlid.get()].push_back(e.qp[i].get() & prm::mgm_qpn_mask);
        }
    }
    if (hca_.port_) {
        for (const auto &[mlid, qpns] : hca_.mcast_members_) {
            if (!members.count(mlid)) {
                hca_.port_->leave_multicast(mlid);
            }
        }
        for (const auto &[mlid, qpns] : members) {
            if (!hca_.mcast_members_.count(mlid)) {
                (void)hca_.port_->join_multicast(mlid);
            }
        }
    }
    hca_.mcast_members_ = std::move(members);
}

} // namespace mlx4x::dev
