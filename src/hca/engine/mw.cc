// SPDX-License-Identifier: BSD-3-Clause
// Memory windows (IBA 10.6.7; seeds C59, E29-E31): bind and local
// invalidate are send WQEs the requester carries out itself, in order with
// the rest of the send queue, and remote accesses through a window's R_Key
// are checked against the window and the region it is bound to.
#include "hca/engine/requester.h"
#include "hca/engine/completer.h"
#include "hca/engine/wqe.h"

#include <cstring>

namespace mlx4x::engine {

/// Runs a bind or invalidate once every earlier WQE has completed (the
/// conservative ordering IBA 10.6.7.2 allows), so its CQE is in order and
/// a rewind never goes back past it.
requester::local_op requester::run_local_op(qp &q, const send_wqe &w)
{
    if (q.comp.sq_tail != q.req.cur_wqe) {
        return local_op::waiting;
    }
    bool ok;
    if (w.opcode == prm::send_opcode::nop) {
        ok = true;
    } else if (w.opcode == prm::send_opcode::bind_mw) {
        prm::wqe_bind_seg b;
        std::memcpy(&b, w.segs, sizeof(b));
        ok = bind_window(q, b);
    } else {
        prm::wqe_local_inval_seg inv;
        std::memcpy(&inv, w.segs, sizeof(inv));
        ok = invalidate_window(q, inv.mem_key.get());
    }
    return ok ? local_op::done : local_op::failed;
}

/// IBA 10.6.7.2 / 11.4.1.1 (Bind Memory Window). False: a rule is broken,
/// which the caller reports as a Memory Window Bind Error (E30).
bool requester::bind_window(qp &q, const prm::wqe_bind_seg &b)
{
    uint32_t new_rkey = b.new_rkey.get();
    uint32_t index    = prm::mkey_index(new_rkey);
    if (index >= hca_.mpts_.size()) {
        return false;
    }
    mpt &w = hca_.mpts_[index];
    bool type2 = (b.flags2.get() & prm::bind_type_2) != 0;
    if (!w.valid || !w.window || w.pd != q.pd || (w.window_type == 2) != type2 ||
        (type2 && w.bound) || new_rkey == w.key ||
        (b.flags2.get() & prm::bind_zero_based)) {
        // Not a window of this PD, the other type, a type 2 window still
        // bound, no new R_Key (C59: every bind makes one), or zero-based
        // addressing (not supported).
        return false;
    }
    uint64_t addr = b.addr.get(), len = b.length.get();
    uint32_t flags1 = b.flags1.get();
    uint32_t perms = ((flags1 & prm::bind_perm_remote_read) ? prm::mpt_perm_remote_read : 0) |
                     ((flags1 & prm::bind_perm_remote_write) ? prm::mpt_perm_remote_write : 0) |
                     ((flags1 & prm::bind_perm_atomic) ? prm::mpt_perm_atomic : 0);
    const mpt *region = nullptr;
    if (len != 0) {
        region = hca_.find_region(b.lkey.get());
        // The region: same PD, bind rights, covering the window; remote
        // write or atomic through the window needs local write on it.
        bool needs_local_write = perms & (prm::mpt_perm_remote_write | prm::mpt_perm_atomic);
        if (!region || region->pd != q.pd || !(region->flags & prm::mpt_perm_bind_mw) ||
            !region->covers(addr, len) ||
            (needs_local_write && !(region->flags & prm::mpt_perm_local_write))) {
            return false;
        }
    }
    if (type2 && len) {
        ++hca_.type2_bound_;   // (a bound type 2 window was refused above)
    }
    // Length 0 unbinds (E31): the window keeps only its new R_Key.
    w.key        = new_rkey;
    w.bound      = len != 0;
    w.start      = len ? addr : 0;
    w.length     = len;
    w.flags      = len ? perms : 0;
    w.region_key = region ? region->key : 0;
    w.bound_qpn  = len && type2 ? q.qpn : 0;
    return true;
}

/// IBA 10.6.7.2.4 (Local Invalidate): a type 2 window bound to this QP
/// becomes free. False for anything else (a memory management error).
bool requester::invalidate_window(qp &q, uint32_t key)
{
    uint32_t index = prm::mkey_index(key);
    mpt *w = index < hca_.mpts_.size() ? &hca_.mpts_[index] : nullptr;
    if (!w || !w->valid || !w->window || w->key != key || w->window_type != 2 ||
        !w->bound || w->bound_qpn != q.qpn) {
        return false;
    }
    unbind(*w);
    return true;
}

void requester::unbind(mpt &w)
{
    if (w.window_type == 2 && w.bound) {
        --hca_.type2_bound_;
    }
    w.bound = false;
    w.start = w.length = 0;
    w.flags = 0;
    w.region_key = w.bound_qpn = 0;
}

/// A QP leaving the fabric frees the type 2 windows bound to it, so a
/// later owner of its number inherits no access.
void requester::release_windows_of(uint32_t qpn)
{
    for (mpt &m : hca_.mpts_) {
        if (hca_.type2_bound_ == 0) {
            return;
        }
        if (m.valid && m.window && m.window_type == 2 && m.bound && m.bound_qpn == qpn) {
            unbind(m);
        }
    }
}

} // namespace mlx4x::engine
