// SPDX-License-Identifier: BSD-3-Clause
// A special QP that carries MADs (IBA 13.5): QP0 for SMPs, QP1 for GMPs
// such as the CM's. Owns its PD, CQ, registered send and receive slots (one
// MAD each, after the 40-byte GRH slot of a UD receive) and an address
// handle per destination LID. What the SMI client and the CM agent share.
// On QP1 it is also the GSI's dispatcher (seed C43: one QP1 per port,
// shared): PerfMgt requests go to the firmware's PMA through MAD_IFC, as
// mlx4_ib's process_mad sends them, and its answer back to the requester.
#pragma once

#include "hca/drv/verbs.h"
#include "hca/ib/ib_mad.h"

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace mlx4x::mad {

class mad_qp {
public:
    /// `type`: drv::qp_type::smi (QP0) or gsi (QP1); `qkey` its Q_Key.
    static result<std::unique_ptr<mad_qp>> create(drv::context &ctx, drv::qp_type type,
                                                  uint32_t qkey, uint32_t slots);
    ~mad_qp();

    /// One MAD to QP `dqpn` of the port at `dlid`. With every send slot in
    /// flight it waits in a backlog, posted in order as poll() frees slots
    /// (as the kernel's MAD layer keeps an overflow list beyond its send
    /// queue); no_resource only when the backlog is full too.
    status send(uint16_t dlid, uint32_t dqpn, uint32_t qkey, const mad &m);
    /// Completions: each received MAD goes to `on_mad(slid, mad)`, then
    /// its slot is posted again; sent slots become free. Returns the MADs.
    /// On QP1, a PerfMgt request is answered here instead (the firmware's
    /// PMA through MAD_IFC; the GetResp to the requester's LID and QP) and
    /// counts as handled.
    unsigned poll(const std::function<void(uint16_t slid, const mad &m)> &on_mad);
    bool ready() const { return cq_->ready(); }
    void arm() { cq_->arm(); }
    bool send_slot_free() const { return sent_ - completed_ < uint32_t(send_.size()); }
    size_t backlog() const { return backlog_.size(); }
    static constexpr size_t max_backlog = 4096;

private:
    explicit mad_qp(drv::context &ctx) : ctx_(ctx) {}
    status post_recv(uint32_t slot);
    void   answer_perf(uint16_t slid, uint32_t src_qp, const mad &request);
    status post_send(uint16_t dlid, uint32_t dqpn, uint32_t qkey, const mad &m);
    void   drain_backlog();

    static constexpr uint32_t grh_size = 40;
    struct slot { uint8_t bytes[grh_size + mad_size]; };

    drv::context                                  &ctx_;
    uint32_t                                       pd_ = 0;
    bool                                           gsi_ = false;   ///< QP1
    std::unique_ptr<drv::cq>                       cq_;
    std::unique_ptr<drv::qp>                       qp_;
    std::vector<slot>                              recv_, send_;
    std::unique_ptr<drv::mr>                       recv_mr_, send_mr_;
    std::map<uint16_t, std::unique_ptr<drv::ah>>   ahs_;
    uint32_t                                       sent_ = 0, completed_ = 0;
    struct queued {
        uint16_t dlid;
        uint32_t dqpn, qkey;
        mad      m;
    };
    std::deque<queued>                             backlog_;
};

} // namespace mlx4x::mad
