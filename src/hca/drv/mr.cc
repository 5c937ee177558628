// SPDX-License-Identifier: BSD-3-Clause
// Address handles, memory regions (MPT entries through SW2HW_MPT) and
// memory windows.
#include "hca/drv/verbs.h"
#include "hca/drv/internal.h"
#include "hca/base/log.h"

#include <cstring>

namespace mlx4x::drv {

using namespace detail;

// ---- address handles ----------------------------------------------------

result<std::unique_ptr<ah>> ah::create(context &ctx, uint32_t pd, const attr &a)
{
    if (status s = ctx.hold_pd(pd); s != status::ok) {
        return s;
    }
    return std::unique_ptr<ah>(new ah(ctx, pd, a));
}

ah::~ah() { ctx_.release_pd(pd_); }

// ---- mr -----------------------------------------------------------------

namespace {

/// A key's 8-bit tag after `tag`. Tag 0 is never used: index 1 with tag 0
/// would be 0x100, the invalid L_Key that ends a receive scatter list.
uint8_t tag_after(uint8_t tag)
{
    return tag == 0xff ? 1 : uint8_t(tag + 1);
}

/// A fresh tag per registration, so a stale key of a reused index fails.
uint8_t next_key_tag()
{
    static std::atomic<uint8_t> last{0};
    uint8_t old = last.load(std::memory_order_relaxed);
    while (!last.compare_exchange_weak(old, tag_after(old), std::memory_order_relaxed)) {
    }
    return tag_after(old);
}

/// An MPT entry (region or window) of PD `pd`, as mlx4 creates one: the PD
/// is held (C24, C59), an index taken with a fresh key, and `write(index,
/// key)` hands the entry to the device (SW2HW_MPT); all undone when it
/// fails. The index and key.
struct new_mpt { uint32_t index, key; };
template <typename Write>
result<new_mpt> create_mpt(context &ctx, uint32_t pd, Write write)
{
    if (status s = ctx.hold_pd(pd); s != status::ok) {
        return s;
    }
    auto taken = ctx.alloc_mpt();
    if (!taken.ok()) {
        ctx.release_pd(pd);
        return taken.error();
    }
    new_mpt m{*taken, prm::make_mkey(*taken, next_key_tag())};
    if (status s = write(m.index, m.key); s != status::ok) {
        ctx.free_mpt(m.index);
        ctx.release_pd(pd);
        return s;
    }
    return m;
}

/// Its end: the PD let go, the entry back from the device and its index
/// free (kept out of use if the device refuses to give it back).
void destroy_mpt(context &ctx, uint32_t pd, uint32_t index)
{
    ctx.release_pd(pd);
    if (ctx.command(prm::cmd_opcode::hw2sw_mpt, index) == status::ok) {
        ctx.free_mpt(index);
    }
}

} // namespace

status mr::write_mpt(context &ctx, uint32_t index, uint32_t key, uint32_t pd,
                     void *addr, size_t len, uint32_t access)
{
    // C53 step 1 / IBA 10.6.3.1: remote write or atomic needs local write.
    if ((access & (access_remote_write | access_remote_atomic)) &&
        !(access & access_local_write)) {
        return status::invalid_param;
    }
    auto *e = static_cast<prm::mpt_entry *>(ctx.mailbox());
    std::memset(e, 0, sizeof(*e));
    e->flags.set(prm::mpt_flag_region | prm::mpt_perm_local_read | access);
    e->key.set(key);
    e->pd_flags.set(pd);
    e->start.set(dma_addr(addr));
    e->length.set(len);
    e->lkey.set(key);
    return ctx.command(prm::cmd_opcode::sw2hw_mpt, index, dma_addr(e));
}

result<std::unique_ptr<mr>> mr::reg(context &ctx, uint32_t pd, void *addr,
                                    size_t len, uint32_t access)
{
    auto m = create_mpt(ctx, pd, [&](uint32_t index, uint32_t key) {
        return write_mpt(ctx, index, key, pd, addr, len, access);
    });
    if (!m.ok()) {
        return m.error();
    }
    return std::unique_ptr<mr>(new mr(ctx, m->index, m->key, pd, addr, len));
}

result<std::unique_ptr<mr>> mr::reg_shared(const mr &orig, uint32_t pd, uint32_t access)
{
    return reg(orig.ctx_, pd, orig.addr_, orig.len_, access);
}

status mr::rereg(void *addr, size_t len, uint32_t access, std::optional<uint32_t> pd)
{
    uint32_t new_pd = pd.value_or(pd_);
    if (new_pd != pd_) {
        if (status s = ctx_.hold_pd(new_pd); s != status::ok) {
            return s;
        }
    }
    status s = rewrite(addr, len, access, new_pd);
    if (new_pd != pd_) {
        ctx_.release_pd(s == status::ok ? pd_ : new_pd);
    }
    if (s == status::ok) {
        pd_ = new_pd;
    }
    return s;
}

/// The MPT goes back to software ownership, is rewritten, and returns to
/// the device (how mlx4 reregisters); a refused entry restores the old.
status mr::rewrite(void *addr, size_t len, uint32_t access, uint32_t pd)
{
    auto *old = static_cast<prm::mpt_entry *>(ctx_.mailbox());
    uint64_t out = dma_addr(old);
    if (status s = ctx_.command(prm::cmd_opcode::query_mpt, index_, 0, &out);
        s != status::ok) {
        return s;
    }
    prm::mpt_entry saved = *old;
    if (status s = ctx_.command(prm::cmd_opcode::hw2sw_mpt, index_); s != status::ok) {
        return s;
    }
    status s = write_mpt(ctx_, index_, key_, pd, addr, len, access);
    if (s != status::ok) {
        auto *e = static_cast<prm::mpt_entry *>(ctx_.mailbox());
        *e = saved;
        (void)ctx_.command(prm::cmd_opcode::sw2hw_mpt, index_, dma_addr(e));
        return s;
    }
    addr_ = addr;
    len_  = len;
    return status::ok;
}

mr::~mr()
{
    destroy_mpt(ctx_, pd_, index_);
}

// ---- mw -----------------------------------------------------------------

result<std::unique_ptr<mw>> mw::alloc(context &ctx, uint32_t pd, type t)
{
    auto m = create_mpt(ctx, pd, [&](uint32_t index, uint32_t key) {
        // An MPT entry without the region flag is a window (mlx4_mw_enable).
        auto *e = static_cast<prm::mpt_entry *>(ctx.mailbox());
        std::memset(e, 0, sizeof(*e));
        e->key.set(key);
        e->pd_flags.set(pd | prm::mpt_pd_flag_en_inv);
        if (t == type::type2) {
            e->flags.set(prm::mpt_flag_free);
            e->qpn.set(prm::mpt_qp_flag_bound_qp);
        }
        return ctx.command(prm::cmd_opcode::sw2hw_mpt, index, dma_addr(e));
    });
    if (!m.ok()) {
        return m.error();
    }
    return std::unique_ptr<mw>(new mw(ctx, m->index, m->key, pd, t));
}

uint32_t mw::next_rkey() const
{
    return prm::make_mkey(index_, tag_after(uint8_t(rkey_)));
}

result<mw::attr> mw::query() const
{
    auto *e = static_cast<prm::mpt_entry *>(ctx_.mailbox());
    uint64_t out = dma_addr(e);
    if (status s = ctx_.command(prm::cmd_opcode::query_mpt, index_, 0, &out);
        s != status::ok) {
        return s;
    }
    attr a;
    a.rkey   = e->key.get();
    a.addr   = e->start.get();
    a.length = e->length.get();
    a.bound  = a.length != 0;
    a.access = e->flags.get() & (access_remote_read | access_remote_write |
                                 access_remote_atomic);
    a.bound_qpn = e->qpn.get() >> 8;
    return a;
}

mw::~mw()
{
    destroy_mpt(ctx_, pd_, index_);
}

} // namespace mlx4x::drv
