// SPDX-License-Identifier: BSD-3-Clause
// Atomics at the responder (IBA 9.4.5, 9.7.5.1.4): compare-and-swap and
// fetch-and-add, 4- and 8-byte masked ones (mlx4x extension), executed once
// and replayed from the responder resource for a duplicate.
#include "hca/engine/responder.h"
#include "hca/base/guarded.h"
#include "hca/engine/egress.h"
#include "hca/engine/completer.h"
#include "hca/engine/pkt.h"
#include "hca/ib/ib_psn.h"

#include <atomic>
#include <cstring>

namespace mlx4x::engine {


namespace {

/// An atomic request, from AtomicETH or the mlx4x masked-atomic header.
struct atomic_req {
    uint64_t va = 0;
    uint32_t rkey = 0;
    size_t   size = sizeof(uint64_t);
    bool     compare_swap = false;
    bool     masked = false;
    uint64_t swap_add = 0, compare = 0, swap_add_mask = 0, compare_mask = 0;
};

atomic_req decode_atomic(const pkt &p)
{
    atomic_req r;
    if (p.has_hdr(ib::hdr_x_atomic_eth)) {
        auto a = p.ext<ib::x_atomic_eth>(ib::hdr_x_atomic_eth);
        r.va            = a.va.get();
        r.rkey          = a.rkey.get();
        r.size          = a.log_size == 2 ? 4 : a.log_size == 3 ? 8 : 0;
        r.compare_swap  = p.opcode == uint8_t(ib::opcode::x_masked_compare_swap);
        r.masked        = true;
        r.swap_add      = a.swap_add.get();
        r.compare       = a.compare.get();
        r.swap_add_mask = a.swap_add_mask.get();
        r.compare_mask  = a.compare_mask.get();
    } else {
        auto a = p.ext<ib::atomic_eth>(ib::hdr_atomic_eth);
        r.va           = a.va.get();
        r.rkey         = a.rkey.get();
        r.compare_swap = p.opcode == uint8_t(ib::opcode::rc_compare_swap);
        r.swap_add     = a.swap_add.get();
        r.compare      = a.compare.get();
    }
    return r;
}

/// Executes the request on `target` with the host's atomics (other agents
/// of the process may use the same word) and returns the old value.
/// Masked compare-and-swap writes (old & ~swap_mask) | (swap & swap_mask)
/// when (old ^ compare) & compare_mask is 0; masked fetch-and-add adds per
/// field, the mask holding each field's top bit, where a carry stops.
template <typename T> uint64_t execute_atomic(T *target, const atomic_req &r)
{
    const T swap_add = T(r.swap_add), compare = T(r.compare);
    if (!r.masked) {
        if (!r.compare_swap) {
            return __atomic_fetch_add(target, swap_add, __ATOMIC_SEQ_CST);
        }
        T old = compare;
        __atomic_compare_exchange_n(target, &old, swap_add, false,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        return old;
    }
    const T swap_mask = T(r.swap_add_mask), compare_mask = T(r.compare_mask);
    // Read by a write of nothing (an OR of 0): the target must be writable
    // even when no compare matches, as for the unmasked operations, whose
    // locked instructions write either way.
    T old = __atomic_fetch_or(target, T(0), __ATOMIC_SEQ_CST);
    T next;
    do {
        if (r.compare_swap) {
            if ((old ^ compare) & compare_mask) {
                return old;   // no match: nothing written
            }
            next = T((old & ~swap_mask) | (swap_add & swap_mask));
        } else {
            next = T(((old & ~swap_mask) + (swap_add & ~swap_mask)) ^
                     ((old ^ swap_add) & swap_mask));
        }
    } while (!__atomic_compare_exchange_n(target, &old, next, false,
                                          __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}

} // namespace

void responder::respond_atomic(qp &q, const pkt &p)
{
    const atomic_req r = decode_atomic(p);
    if (r.size == 0) {
        responder_error(q, ib::nak_code::invalid_request);   // bad operand size
        return;
    }
    if (!hca_.check_rkey(q, r.rkey, r.va, r.size, prm::mpt_perm_atomic)) {
        responder_error(q, ib::nak_code::remote_access);
        return;
    }
    if (r.va % r.size) {
        responder_error(q, ib::nak_code::invalid_request);   // misaligned
        return;
    }
    resp_resource res;
    res.kind     = resp_resource::type::atomic;
    res.psn      = p.psn;
    res.npackets = 1;
    if (resource_resending(q)) {
        return;   // not executed: the requester sends it again
    }
    if (q.resp.resp_count == q.resp.resources.size()) {
        responder_error(q, ib::nak_code::invalid_request);   // depth exceeded
        return;
    }
    void *target = reinterpret_cast<void *>(static_cast<uintptr_t>(r.va));
    // Memory unmapped (or read-only) under a region still registered fails
    // as a bad R_Key does (guarded.h, E28). The operation is the check: the
    // application may unmap from another thread between a probe and it.
    if (!guarded_run([&] {
            res.orig = r.size == 4 ? execute_atomic(static_cast<uint32_t *>(target), r)
                                   : execute_atomic(static_cast<uint64_t *>(target), r);
        })) {
        responder_error(q, ib::nak_code::remote_access);
        return;
    }
    (void)take_resource(q, res);
    q.resp.epsn = ib::psn_add(q.resp.epsn, 1);
    q.resp.msn  = ib::psn_add(q.resp.msn, 1);
}

/// A duplicate atomic is never executed twice (IBA 9.7.5.1.1): its saved
/// result is sent again if the responder still holds it (the requester
/// keeps at most as many atomics in flight as there are resources).
void responder::replay_atomic(qp &q, uint32_t psn)
{
    resp_resource *r = find_resource(q, psn);
    if (r && r->kind == resp_resource::type::atomic) {
        r->again = r->again || !r->queued;
        queue_response(q, uint32_t(r - q.resp.resources.data()));
    }
}

status responder::send_atomic_ack(qp &q, const resp_resource &r)
{
    std::array<uint8_t, sizeof(ib::aeth) + sizeof(ib::atomic_ack_eth)> ext;
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn, ack_syndrome);
    ib::aeth_msn::set(a.syn_msn, q.resp.msn);
    ib::atomic_ack_eth ack;
    ack.orig.set(r.orig);
    std::memcpy(ext.data(), &a, sizeof(a));
    std::memcpy(ext.data() + sizeof(a), &ack, sizeof(ack));
    return out_.emit({.pkey    = q.pkey,
                     .opcode  = uint8_t(ib::opcode::rc_atomic_acknowledge),
                 .dlid    = q.dlid,
                 .dqpn    = q.remote_qpn,
                 .psn     = r.psn,
                 .ackreq  = false,
                 .ext     = ext,
                 .payload = {}});
}

} // namespace mlx4x::engine
