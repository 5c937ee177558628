// SPDX-License-Identifier: BSD-3-Clause
// Tag matching on a TM SRQ (prm_tm.h): the list operations of a TM
// command QP, an incoming tagged message's match against the posted-tag
// list, eager placement into a matched buffer, and the rendezvous READ the
// device posts on its own send queue. tm.cc.
#pragma once

#include "hca/core/core.h"
#include "hca/engine/pkt.h"
#include "hca/engine/roles.h"
#include "hca/engine/wqe.h"
#include "hca/ib/ib_tm.h"

#include <optional>
#include <span>

namespace mlx4x::engine {

class tag_matcher {
public:
    tag_matcher(dev::core &hca, requester &req, responder &resp)
        : hca_(hca), req_(req), resp_(resp)
    {
    }
    tag_matcher(const tag_matcher &) = delete;
    tag_matcher &operator=(const tag_matcher &) = delete;

    srq *tm_srq_of(const qp &q)
    {
        srq *s = hca_.srq_of(q);
        return s && s->tm ? s : nullptr;
    }
    bool     run_tm_command(qp &q);
    bool     tm_first_packet(qp &q, srq &s, const pkt &p, bool last);
    dev::scatter_result tm_scatter(qp &q, std::span<const uint8_t> data);
    void     tm_complete_eager(qp &q, const pkt &p, bool failed);
    void     tm_dev_wqe_done(qp &q, uint32_t index, bool error);

private:
    void     tm_start_rndv(qp &q, srq &s, uint32_t index, const ib::tmh &h,
                           const ib::rvh &r);
    void     tm_finish_rndv(qp &q, const tm_rndv &op, bool ok);
    void     tm_rndv_cqe(qp &q, const tm_rndv &op, prm::tm_cqe_opcode opcode,
                         uint32_t byte_cnt, uint8_t flags);
    void     tm_post_dev_wqe(qp &q, prm::send_opcode op, bool signalled,
                             std::span<const uint8_t> segs, const tm_rndv &what);
    uint32_t tm_dev_sq_room(const qp &q) const
    {
        return uint32_t(q.dev_sq.size()) - (q.dev_sq_head - q.comp.sq_tail);
    }

    dev::core    &hca_;
    requester    &req_;
    responder    &resp_;
};

} // namespace mlx4x::engine
