// SPDX-License-Identifier: BSD-3-Clause
#include "hca/fw/device_sma.h"

#include "hca/base/log.h"

#include <bit>
#include <cstring>
#include <string>
#include <unistd.h>

namespace mlx4x::mad {

void device_sma::port_up(uint16_t lid, uint64_t port_guid)
{
    port_state p;
    p.port_guid = port_guid;
    // The node GUID the device reports in QUERY_PORT (port GUID, low byte 0).
    p.node_guid = port_guid & ~uint64_t{0xff};
    p.system_image_guid = p.node_guid;
    // As rdma-ndd names a node ("<host> <HCA>"); each process is an HCA
    // here, so its pid tells them apart in the tools' listings.
    char host[64] = "localhost";
    (void)gethostname(host, sizeof(host) - 1);
    p.node_description = std::string(host) + " mlx4x_0 pid " + std::to_string(getpid());
    // No master SM: sm_lid stays 0, so no trap is queued for nobody.
    agent_ = std::make_unique<sma>(std::move(p));
    agent_->link_up();   // DOWN -> INIT (IBA 7.2)
    if (wait_for_sm_) {
        return;          // the SM takes it from here
    }
    // The SM's bring-up sequence (IBA 14.4.5): LID in INIT, then ARMED,
    // then ACTIVE. Each step is a legal transition; a failure means the
    // state machine and this sequence disagree, a bug worth a log line.
    if (!set_port_info(lid, logical_state::nop) ||
        !set_port_info(lid, logical_state::armed) ||
        !set_port_info(lid, logical_state::active)) {
        MLX4X_ERROR("sma: port bring-up to active with lid %u failed", lid);
    }
}

bool device_sma::set_port(uint32_t capability_mask, bool reset_qkey_violations)
{
    if (!agent_) {
        return false;
    }
    agent_->modify_port(capability_mask, reset_qkey_violations);
    return true;
}

void device_sma::count_violation(bool qkey)
{
    if (agent_) {
        qkey ? agent_->add_qkey_violation() : agent_->add_pkey_violation();
    }
}

bool device_sma::take_trap(uint8_t *mad_out, uint16_t &dlid)
{
    std::optional<mad> t = agent_ ? agent_->take_trap() : std::nullopt;
    if (!t) {
        return false;
    }
    std::memcpy(mad_out, &*t, sizeof(*t));
    dlid = agent_->state().sm_lid;
    return true;
}

void device_sma::port_down()
{
    if (agent_) {
        agent_->link_down();
    }
    agent_.reset();
}

bool device_sma::process(const uint8_t *in, uint8_t *out, bool local,
                         uint16_t requester_lid)
{
    if (!agent_) {
        return false;   // port down: no SMA answers (MAD_IFC outbox empty)
    }
    mad request, response;
    std::memcpy(&request, in, sizeof(request));
    if (agent_->process(request, response, local, requester_lid) != status::ok) {
        return false;
    }
    // E44: a DR response with hop count 0 is for this node's own SM. From
    // MAD_IFC (requester_lid 0: the SMP came on no packet) it goes back in
    // the outbox, with or without the ignore-M_Key modifier; one that came
    // on QP0 would need the wire and is dropped.
    if (requester_lid != 0 && dr_response_is_local(response)) {
        return false;
    }
    std::memcpy(out, &response, sizeof(response));
    return true;
}

bool device_sma::process_perf(const uint8_t *in, uint8_t *out,
                              const hw::port_counters &now)
{
    if (!agent_) {
        return false;   // port down: nobody answers
    }
    mad request, response;
    std::memcpy(&request, in, sizeof(request));
    if (pma_.process(request, response, now) != status::ok) {
        return false;
    }
    std::memcpy(out, &response, sizeof(response));
    return true;
}

/// A local Set(PortInfo) of `lid` and `state` on the current PortInfo.
bool device_sma::set_port_info(uint16_t lid, logical_state state)
{
    mad in = std::bit_cast<mad>(make_local_get(smp_attr::port_info));
    mad out;
    if (agent_->process(in, out, true) != status::ok) {
        return false;
    }
    smp set = port_info_set_from_get(std::bit_cast<smp>(out), [&](port_info &pi) {
        pi.lid.set(lid);
        pi_port_state::set(pi.speed_sup_state, static_cast<uint8_t>(state));
    });
    if (agent_->process(std::bit_cast<mad>(set), out, true) != status::ok) {
        return false;
    }
    return std::bit_cast<smp>(out).hdr.status.get() == 0;
}

} // namespace mlx4x::mad
