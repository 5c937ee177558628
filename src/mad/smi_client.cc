// SPDX-License-Identifier: BSD-3-Clause
#include "mad/smi_client.h"

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
