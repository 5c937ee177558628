// SPDX-License-Identifier: BSD-3-Clause
// Memory registration for UCT: an MR per registration, kept in UCS's
// registration cache (as UCX's own IB memory domain does) so registering
// the same buffer again is a lookup. The cache drops regions whose memory
// is unmapped (UCM events); invalidation completes when the last user of a
// region lets go, after which its rkey fails every remote access.
#include "uct_mlx4x/mlx4x_boundary.h"
#include "uct_mlx4x/mlx4x_iface.h"
#include "hca/base/log.h"

#include <ucm/api/ucm.h>
#include <ucs/sys/sys.h>
#include <sys/mman.h>

#include <cstdio>

namespace mlx4x::uct {

namespace {

/// Every registration allows everything UCT may ask of it; the rights a
/// remote peer gets are decided by whom the rkey is given to.
constexpr uint32_t all_rights = drv::access_local_write | drv::access_remote_write |
                                drv::access_remote_read | drv::access_remote_atomic;

void invalidated(void *comp)
{
    uct_invoke_completion(static_cast<uct_completion_t *>(comp), UCS_OK);
}

} // namespace

result<drv::mr *> memory_domain::register_region(uintptr_t start, uintptr_t end)
{
    auto r = drv::mr::reg(*ctx_, pd_, reinterpret_cast<void *>(start), end - start,
                          all_rights);
    if (!r.ok()) {
        return r.error();
    }
    return r.take().release();
}

/// The cache, if UCM can tell it about unmapped memory; otherwise none.
void memory_domain::create_rcache(const uct_md_rcache_config_t &cfg)
{
    static const ucs_rcache_ops_t ops = {
        .mem_reg     = rcache_reg,
        .mem_dereg   = rcache_dereg,
        .dump_region = rcache_dump,
    };
    ucs_rcache_params_t p{};
    uct_md_set_rcache_params(&p, &cfg);
    p.region_struct_size = sizeof(mem_handle);
    p.max_alignment      = ucs_get_page_size();
    p.ucm_events         = UCM_EVENT_VM_UNMAPPED;
    p.context            = this;
    p.ops                = &ops;
    if (ucs_rcache_create(&p, "mlx4x_0", nullptr, &rcache_) != UCS_OK) {
        // No memory events (UCX_MEM_EVENTS=no, or under valgrind): without
        // them a cache could hand out stale registrations, so go without,
        // as UCX's IB memory domain does.
        MLX4X_DIAG("no registration cache (memory events unavailable): "
                   "every registration goes to the device");
        rcache_ = nullptr;
    }
}

ucs_status_t memory_domain::rcache_reg(void *md, ucs_rcache_t *, void *,
                                       ucs_rcache_region_t *region, uint16_t flags)
{
    auto *self = static_cast<memory_domain *>(md);
    auto *h    = reinterpret_cast<mem_handle *>(region);
    auto  r    = self->register_region(region->super.start, region->super.end);
    if (!r.ok()) {
        if (!(flags & UCS_RCACHE_MEM_REG_HIDE_ERRORS)) {
            MLX4X_ERROR("cannot register 0x%lx..0x%lx: %s",
                        static_cast<unsigned long>(region->super.start),
                        static_cast<unsigned long>(region->super.end),
                        to_string(r.error()));
        }
        return to_ucs(r.error());
    }
    h->mr = *r;
    return UCS_OK;
}

void memory_domain::rcache_dereg(void *, ucs_rcache_t *, ucs_rcache_region_t *region)
{
    auto *h = reinterpret_cast<mem_handle *>(region);
    delete h->mr;
    h->mr = nullptr;
}

void memory_domain::rcache_dump(void *, ucs_rcache_t *, ucs_rcache_region_t *region,
                                char *buf, size_t max)
{
    auto *h = reinterpret_cast<mem_handle *>(region);
    std::snprintf(buf, max, "lkey 0x%x rkey 0x%x", h->mr ? h->mr->lkey() : 0,
                  h->mr ? h->mr->rkey() : 0);
}

ucs_status_t memory_domain::reg(void *address, size_t length, uct_mem_h *memh)
{
    if (rcache_) {
        ucs_rcache_region_t *region;
        ucs_status_t st = ucs_rcache_get(rcache_, address, length,
                                         PROT_READ | PROT_WRITE, nullptr, &region);
        if (st == UCS_OK) {
            *memh = region;
        }
        return st;
    }
    auto *h = new mem_handle{};
    auto  r = register_region(reinterpret_cast<uintptr_t>(address),
                              reinterpret_cast<uintptr_t>(address) + length);
    if (!r.ok()) {
        delete h;
        MLX4X_ERROR("cannot register %p length %zu: %s", address, length,
                    to_string(r.error()));
        return to_ucs(r.error());
    }
    h->mr = *r;
    *memh = h;
    return UCS_OK;
}

void memory_domain::dereg(uct_mem_h memh, uct_completion_t *invalidate)
{
    auto *h = static_cast<mem_handle *>(memh);
    if (rcache_) {
        if (invalidate) {
            ucs_rcache_region_invalidate(rcache_, &h->region, invalidated, invalidate);
        }
        ucs_rcache_region_put(rcache_, &h->region);
        return;
    }
    // HW2SW_MPT returns once the device has let go of the region: the rkey
    // fails every later access (an RDMA in progress runs under the device
    // lock the command takes), so invalidation is complete here.
    delete h->mr;
    delete h;
    if (invalidate) {
        uct_invoke_completion(invalidate, UCS_OK);
    }
}

} // namespace mlx4x::uct
