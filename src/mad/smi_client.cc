// SPDX-License-Identifier: BSD-3-Clause
#include "mad/smi_client.h"

#include <algorithm>
#include <bit>
#include <thread>

namespace mlx4x::mad {

using clock = std::chrono::steady_clock;

result<std::unique_ptr<smi_client>> smi_client::create(drv::context &ctx, idle_fn idle)
{
    std::unique_ptr<smi_client> c(new smi_client(ctx, std::move(idle)));
    auto q = mad_qp::create(ctx, drv::qp_type::smi, 0, 256);
    if (!q.ok()) {
        return q.error();
    }
    c->qp0_ = q.take();
    return c;
}

smi_client::~smi_client() = default;

status smi_client::send(uint16_t dlid, const smp &s)
{
    while (!qp0_->send_slot_free()) {   // a sweep has them all in flight
        if (aborted_) {
            return status::canceled;
        }
        collect(clock::now(), [](uint16_t, const smp &) { return false; });
    }
    return qp0_->send(dlid, 0, 0, std::bit_cast<mad>(s));   // every SMA is at QP0
}

void smi_client::collect(clock::time_point until,
                         const std::function<bool(uint16_t, const smp &)> &on_answer)
{
    bool done = false;
    do {
        if (aborted_) {
            return;
        }
        unsigned work = ctx_.progress();
        if (idle_ && !idle_()) {
            aborted_ = true;
            return;
        }
        qp0_->poll([&](uint16_t slid, const mad &m) {
            ++work;
            auto s = std::bit_cast<smp>(m);
            if (s.hdr.method == uint8_t(method::trap)) {
                repress(slid, s);
            } else if (!done && s.hdr.method == uint8_t(method::get_resp)) {
                done = on_answer(slid, s);
            }
        });
        if (!work && !idle_) {
            // Waiting on other processes: give the core away (an SM sweeps
            // in the background of MPI ranks).
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    } while (!done && clock::now() < until);
}

/// IBA 14.2.5.1 / 13.4.9: a trap is acknowledged with a TrapRepress of the
/// same TID and attribute, so its issuer stops repeating it.
void smi_client::repress(uint16_t slid, const smp &trap)
{
    smp r = trap;
    r.hdr.method = uint8_t(method::trap_repress);
    (void)qp0_->send(slid, 0, 0, std::bit_cast<mad>(r));
    if (on_trap_) {
        on_trap_(slid, trap);
    }
}

std::optional<smp> smi_client::get(uint16_t dlid, smp_attr attr, uint32_t attr_mod,
                                   duration timeout, unsigned tries)
{
    return request(dlid, make_local_get(attr, attr_mod), timeout, tries);
}

std::optional<smp> smi_client::request(uint16_t dlid, smp req, duration timeout,
                                       unsigned tries)
{
    uint64_t tid = next_tid_++;
    req.hdr.tid.set(tid);
    aborted_ = false;
    std::optional<smp> answer;
    for (unsigned t = 0; t < tries && !answer; ++t) {
        if (send(dlid, req) != status::ok) {
            break;
        }
        collect(clock::now() + timeout, [&](uint16_t from, const smp &s) {
            if (from == dlid && s.hdr.tid.get() == tid) {
                answer = s;
                return true;
            }
            return false;
        });
    }
    return answer;
}

result<smp> smi_client::get_dr(const dr_path &path, smp_attr attr, uint32_t attr_mod,
                               duration timeout, unsigned tries)
{
    if (path.size() >= smp_max_hops) {
        return status::invalid_param;   // C14-6: HopCount 0..63
    }
    smp req = make_local_get(attr, attr_mod);
    req.hdr.mgmt_class = uint8_t(mgmt_class::subn_directed_route);
    req.hdr.tid.set(next_tid_++);
    smp_hop_cnt::set(req.hdr.class_specific, uint8_t(path.size()));
    smp_hop_ptr::set(req.hdr.class_specific, 0);
    req.dr_slid.set(permissive_lid);
    req.dr_dlid.set(permissive_lid);
    std::copy(path.begin(), path.end(), req.initial_path + 1);

    if (path.empty()) {
        // E44: for the node's own SMA, through the firmware; M_Key checked
        // (no ignore-M_Key op_modifier), as the SM's SMPs are.
        mad resp{};
        if (status s = ctx_.mad_ifc(std::bit_cast<mad>(req), resp, false); s != status::ok) {
            return s;
        }
        return std::bit_cast<smp>(resp);
    }
    // C14-9:1: the sender's SMI steps the hop pointer to 1; the SMP leaves
    // by InitialPath[1], which on a CA can only be its own port.
    if (path[0] != own_port) {
        return status::invalid_param;
    }
    smp_hop_ptr::set(req.hdr.class_specific, 1);
    const uint64_t tid = req.hdr.tid.get();
    aborted_ = false;
    std::optional<smp> answer;
    for (unsigned t = 0; t < tries && !answer; ++t) {
        if (status s = send(permissive_lid, req); s != status::ok) {
            return s;
        }
        collect(clock::now() + timeout, [&](uint16_t, const smp &s) {
            // C14-13:3: the returning SMP ends its directed part here with
            // the hop pointer at 1 (DrSLID permissive) and goes to the SM.
            if (s.hdr.tid.get() != tid ||
                s.hdr.mgmt_class != uint8_t(mgmt_class::subn_directed_route) ||
                smp_direction::get(s.hdr.status) != 1 ||
                smp_hop_ptr::get(s.hdr.class_specific) != 1) {
                return false;
            }
            answer = s;
            smp_hop_ptr::set(answer->hdr.class_specific, 0);
            return true;
        });
    }
    if (!answer) {
        return status::timed_out;
    }
    return *answer;
}

std::map<uint16_t, smp> smi_client::sweep(smp_attr attr, uint16_t max_lid,
                                          duration timeout, unsigned tries)
{
    std::map<uint16_t, smp> answers;
    uint64_t tid = next_tid_++;
    aborted_ = false;
    for (unsigned t = 0; t < tries; ++t) {
        for (uint16_t lid = 1; lid <= max_lid; ++lid) {
            if (answers.count(lid) == 0) {
                smp req = make_local_get(attr);
                req.hdr.tid.set(tid);
                (void)send(lid, req);
            }
        }
        collect(clock::now() + timeout, [&](uint16_t from, const smp &s) {
            if (s.hdr.tid.get() == tid && from >= 1 && from <= max_lid) {
                answers.emplace(from, s);
            }
            return false;
        });
    }
    return answers;
}

} // namespace mlx4x::mad
