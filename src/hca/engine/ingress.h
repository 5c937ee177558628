// SPDX-License-Identifier: BSD-3-Clause
// Ingress (IBA 9.6): every frame the port delivers is parsed and checked
// once — LRH, BTH, P_Key, the QP and its state, the source — and handed to
// the responder, the completer, or the datagram path; the fast paths for
// the common small SEND and the common ACK first (fast_rx.inl).
// ingress.cc.
#pragma once

#include "hca/core/core.h"
#include "hca/engine/pkt.h"
#include "hca/engine/reorder.h"
#include "hca/engine/roles.h"
#include "hca/engine/wqe.h"

#include <optional>
#include <span>

namespace mlx4x::engine {

class ingress final : public fabric::frame_sink {
public:
    ingress(dev::core &hca, responder &resp, completer &comp)
        : hca_(hca), resp_(resp), comp_(comp)
    {
    }
    ingress(const ingress &) = delete;
    ingress &operator=(const ingress &) = delete;

    bool on_frame(std::span<const uint8_t> frame) override;
    static bool continues_message(const qp &q, const pkt &p);
    /// A QP going to RESET: frames held for it are dropped.
    void forget_held_of(uint32_t qpn) { held_.forget(qpn); }

private:
    void receive_multicast(const pkt &p);
    /// `again`: a held frame in its turn, whose bytes were counted when
    /// it came.
    void receive(std::span<const uint8_t> frame, bool again = false);
    bool admits(const qp &q, const pkt &p);
    qp  *fast_path_qp(const ib::lrh &l, const ib::bth &b);
    bool receive_send_only(std::span<const uint8_t> frame);
    bool receive_send_part(std::span<const uint8_t> frame);
    bool receive_ack(std::span<const uint8_t> frame);
    /// A connected-service packet dropped for a reason a live connection
    /// never gives (no such QP, a QP not receiving, another port's): said
    /// at DIAG level, the first few per device, since its sender will
    /// only see its retries run out.
    void tell_dropped(const pkt &p, const char *why, const qp *q);
    /// Whether request `p`, `ahead` PSNs past what `q` expects, is held
    /// for its turn (reorder_buffer) instead of NAKed.
    bool holds_early(const qp &q, const pkt &p, int32_t ahead, std::span<const uint8_t> frame);
    /// Whether response `p` for `q`'s requester is held for its turn: a
    /// READ or atomic response ahead of the one awaited, or a positive ACK
    /// that overtook it.
    bool holds_early_response(const qp &q, const pkt &p, std::span<const uint8_t> frame);
    using stream  = reorder_buffer::stream;
    using outcome = reorder_buffer::outcome;
    outcome hold(const qp &q, stream st, uint32_t psn, std::span<const uint8_t> frame);
    /// After `frame`: executes the frames held for its QP whose turn has
    /// come, drops those passed.
    void drain_held(std::span<const uint8_t> frame);

    unsigned      drops_to_tell_ = 16;
    reorder_buffer held_;
    dev::core    &hca_;
    responder    &resp_;
    completer    &comp_;
};

} // namespace mlx4x::engine
