// SPDX-License-Identifier: BSD-3-Clause
// The device firmware: the HCR command interface (Linux mlx4 cmd.c's
// cmd_info[] shape: one dispatch on the opcode) and what each command does
// to the device's objects — ports, MTTs and MPTs, CQs, EQs, SRQs,
// multicast groups (cmd.cc, eq.cc, srq.cc, mcg.cc) and the QP transitions
// of IBA 10.3 (cmd_qp.cc). The SMA it answers MAD_IFC with is hca/fw's,
// through dev::core::sma_.
#pragma once

#include "hca/core/core.h"
#include "hca/engine/roles.h"
#include "hca/prm/prm_cmd.h"

namespace mlx4x::dev {

class firmware {
public:
    firmware(core &hca, engine::requester &req, engine::responder &resp,
             engine::completer &comp, engine::ingress &in)
        : hca_(hca), req_(req), resp_(resp), comp_(comp), in_(in)
    {
    }
    firmware(const firmware &) = delete;
    firmware &operator=(const firmware &) = delete;

    /// Runs one command from the HCR's fields; its status for the HCR.
    prm::cmd_status dispatch(prm::cmd_opcode op, uint8_t op_mod,
                             uint32_t in_mod, uint64_t in_param,
                             uint64_t &out_param);
    /// A command since the last call registered memory peers may access
    /// without the application (remote read, write or atomic).
    bool took_remote_access() { return std::exchange(remote_access_granted_, false); }

private:
    prm::cmd_status cmd_query_dev_cap(uint64_t outbox);
    prm::cmd_status cmd_init_port(uint32_t port);
    prm::cmd_status cmd_close_port(uint32_t port);
    prm::cmd_status cmd_set_port(uint32_t port, uint8_t op_mod, uint64_t inbox);
    prm::cmd_status cmd_query_port(uint32_t port, uint64_t outbox);
    prm::cmd_status cmd_query_if_stat(uint32_t port, uint64_t outbox);
    hw::port_counters port_counters() const;
    uint64_t          link_errors() const;
    prm::cmd_status cmd_mad_ifc(uint32_t port, uint8_t op_mod, uint64_t inbox,
                                uint64_t outbox);
    prm::cmd_status cmd_write_mtt(uint32_t count, uint64_t inbox);
    uint8_t        *mtt_buffer(uint8_t addr_h, uint32_t addr_l) const;
    prm::cmd_status cmd_sw2hw_mpt(uint32_t index, uint64_t inbox);
    prm::cmd_status cmd_query_mpt(uint32_t index, uint64_t outbox);
    prm::cmd_status cmd_query_adapter(uint64_t outbox);
    prm::cmd_status cmd_hw2sw_mpt(uint32_t index);
    prm::cmd_status cmd_sw2hw_eq(uint32_t eqn, uint64_t inbox);
    prm::cmd_status cmd_hw2sw_eq(uint32_t eqn);
    prm::cmd_status cmd_map_eq(uint32_t eqn, uint8_t op_mod, uint64_t mask);
    prm::cmd_status cmd_query_eq(uint32_t eqn, uint64_t outbox);
    prm::cmd_status cmd_sw2hw_srq(uint32_t srqn, uint64_t inbox);
    prm::cmd_status cmd_hw2sw_srq(uint32_t srqn);
    prm::cmd_status cmd_query_srq(uint32_t srqn, uint64_t outbox);
    prm::cmd_status cmd_arm_srq(uint32_t srqn, uint64_t limit);
    prm::cmd_status cmd_mgid_hash(uint64_t inbox, uint64_t &hash);
    prm::cmd_status cmd_read_mcg(uint32_t index, uint64_t outbox);
    prm::cmd_status cmd_write_mcg(uint32_t index, uint64_t inbox);
    void            update_multicast();
    prm::cmd_status cmd_sw2hw_cq(uint32_t cqn, uint64_t inbox);
    prm::cmd_status cmd_hw2sw_cq(uint32_t cqn);
    prm::cmd_status cmd_query_cq(uint32_t cqn, uint64_t outbox);
    prm::cmd_status cmd_resize_cq(uint32_t cqn, uint64_t inbox);
    prm::cmd_status cmd_qp_transition(prm::cmd_opcode op, uint32_t qpn,
                                      uint64_t inbox);
    prm::cmd_status cmd_query_qp(uint32_t qpn, uint64_t outbox);
    struct qp_resources {
        cq      *scq = nullptr, *rcq = nullptr;
        srq     *shared_rq = nullptr;   ///< the SRQ it receives from, if any
        uint8_t *buf = nullptr;
    };
    prm::cmd_status resolve_qp_context(uint32_t qpn, const prm::qp_context &ctx,
                                       qp_resources &r);
    prm::cmd_status qp_from_reset(qp &q, uint32_t qpn, const prm::qp_context &ctx);
    void make_device_sq(qp &q, uint32_t sq_log);
    prm::cmd_status qp_to_rtr(qp &q, const prm::qp_context &ctx);
    void            qp_to_rts(qp &q, const prm::qp_context &ctx);
    void            apply_optional(qp &q, const prm::qp_context &ctx,
                                   uint32_t optpar);
    void            qp_to_reset(qp &q);

    core              &hca_;
    engine::requester &req_;
    engine::responder &resp_;
    engine::completer &comp_;
    engine::ingress   &in_;
    bool               remote_access_granted_ = false;
};

} // namespace mlx4x::dev
