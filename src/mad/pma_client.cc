// SPDX-License-Identifier: BSD-3-Clause
#include "mad/pma_client.h"

#include "hca/ib/ib_cm.h"

#include <bit>
#include <thread>

namespace mlx4x::mad {

using clock = std::chrono::steady_clock;

result<std::unique_ptr<pma_client>> pma_client::create(drv::context &ctx)
{
    std::unique_ptr<pma_client> c(new pma_client(ctx));
    auto q = mad_qp::create(ctx, drv::qp_type::gsi, cm::gsi_qkey, 16);
    if (!q.ok()) {
        return q.error();
    }
    c->qp1_ = q.take();
    return c;
}

pma_client::~pma_client() = default;

std::optional<pma::perf_mad> pma_client::request(uint16_t dlid, pma::perf_mad req,
                                                 duration timeout, unsigned tries)
{
    // TIDs start from the clock so that two runs of a tool against one
    // agent do not reuse each other's.
    if (next_tid_ == 1) {
        next_tid_ = uint64_t(clock::now().time_since_epoch().count()) << 8;
    }
    const uint64_t tid = next_tid_++;
    req.hdr.tid.set(tid);
    std::optional<pma::perf_mad> answer;
    for (unsigned t = 0; t < tries && !answer; ++t) {
        if (qp1_->send(dlid, 1, cm::gsi_qkey, std::bit_cast<mad>(req)) != status::ok) {
            break;   // every PMA is at QP1 of its port
        }
        const auto until = clock::now() + timeout;
        do {
            unsigned work = ctx_.progress();
            work += qp1_->poll([&](uint16_t slid, const mad &m) {
                if (slid == dlid && m.hdr.mgmt_class == uint8_t(mgmt_class::perf) &&
                    m.hdr.method == uint8_t(method::get_resp) && m.hdr.tid.get() == tid) {
                    answer = std::bit_cast<pma::perf_mad>(m);
                }
            });
            if (!work) {
                std::this_thread::sleep_for(std::chrono::microseconds(50));
            }
        } while (!answer && clock::now() < until);
    }
    return answer;
}

} // namespace mlx4x::mad
