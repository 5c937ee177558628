// SPDX-License-Identifier: BSD-3-Clause
// Memory regions and windows (C59) and UD address handles.
#pragma once

#include "hca/drv/context.h"

namespace mlx4x::drv {

// ---- memory regions ---------------------------------------------------

enum access : uint32_t {
    access_local_write  = prm::mpt_perm_local_write,
    access_remote_write = prm::mpt_perm_remote_write,
    access_remote_read  = prm::mpt_perm_remote_read,
    access_remote_atomic= prm::mpt_perm_atomic,
    access_mw_bind      = prm::mpt_perm_bind_mw,   ///< windows may bind to it
};

class mr {
public:
    static result<std::unique_ptr<mr>> reg(context &ctx, uint32_t pd,
                                           void *addr, size_t len,
                                           uint32_t access);
    ~mr();
    /// C57: a new registration of `orig`'s range, possibly in another PD
    /// and with other rights. The device translates process addresses
    /// and nothing is pinned, so deregistering either leaves the other
    /// intact (E32) with nothing to count.
    static result<std::unique_ptr<mr>> reg_shared(const mr &orig, uint32_t pd,
                                                  uint32_t access);
    /// C55: re-register the same handle for another range / access, and
    /// (E33) in PD `pd` if given (its count goes up, the old one's down);
    /// the keys stay. On failure the old registration is kept.
    status rereg(void *addr, size_t len, uint32_t access,
                 std::optional<uint32_t> pd = std::nullopt);
    uint32_t pd() const { return pd_; }
    uint32_t lkey() const { return key_; }
    uint32_t rkey() const { return key_; }
    void    *addr() const { return addr_; }
    size_t   length() const { return len_; }

private:
    mr(context &c, uint32_t idx, uint32_t key, uint32_t pd, void *a, size_t l)
        : ctx_(c), index_(idx), key_(key), pd_(pd), addr_(a), len_(l) {}
    status rewrite(void *addr, size_t len, uint32_t access, uint32_t pd);
    static status write_mpt(context &ctx, uint32_t index, uint32_t key,
                            uint32_t pd, void *addr, size_t len, uint32_t access);
    context &ctx_;
    uint32_t index_, key_, pd_;
    void    *addr_;
    size_t   len_;
};

// ---- memory windows ---------------------------------------------------

/// A memory window (IBA 10.6.7, C59): allocated and freed through the
/// firmware (privileged), bound and unbound by WQEs on an RC send queue
/// (send_wr with wr_opcode::bind_mw; type 2 is invalidated by
/// wr_opcode::local_inv). Every bind gives it a new R_Key (E29).
class mw {
public:
    enum class type : uint8_t { type1 = 1, type2 = 2 };
    static result<std::unique_ptr<mw>> alloc(context &ctx, uint32_t pd, type t);
    ~mw();
    /// The R_Key of the last bind posted (before any: one granting nothing).
    uint32_t rkey() const { return rkey_; }
    type     kind() const { return type_; }
    uint32_t pd() const { return pd_; }

    /// What the device holds (Query Memory Window, C59).
    struct attr {
        uint32_t rkey = 0;
        bool     bound = false;
        uint64_t addr = 0, length = 0;
        uint32_t access = 0;       ///< access_remote_*
        uint32_t bound_qpn = 0;    ///< type 2
    };
    result<attr> query() const;

private:
    friend class qp;
    mw(context &c, uint32_t idx, uint32_t key, uint32_t pd, type t)
        : ctx_(c), index_(idx), rkey_(key), pd_(pd), type_(t) {}
    /// The R_Key a bind posted now gives: the same index, the next tag.
    uint32_t next_rkey() const;
    context &ctx_;
    uint32_t index_, rkey_, pd_;
    type     type_;
};

// ---- address handles --------------------------------------------------

/// A UD destination (C28-C30). As in libmlx4 the address vector is copied
/// into each UD WQE's datagram segment, with the AH's port and PD, which the
/// device checks against the QP's (E23, E24).
class ah {
public:
    struct attr {
        uint16_t dlid;
        uint8_t  sl   = 0;
        uint8_t  port = 1;
    };
    static result<std::unique_ptr<ah>> create(context &ctx, uint32_t pd,
                                              const attr &a);
    ~ah();
    const attr &query() const { return attr_; }
    void modify(const attr &a) { attr_ = a; }
    uint32_t pd() const { return pd_; }

private:
    ah(context &c, uint32_t pd, const attr &a) : ctx_(c), pd_(pd), attr_(a) {}
    context &ctx_;
    uint32_t pd_;
    attr     attr_;
};

} // namespace mlx4x::drv
