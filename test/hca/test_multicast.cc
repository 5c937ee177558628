// SPDX-License-Identifier: BSD-3-Clause
// UD multicast (IBA 10.5.2.3, 11.3.1; seeds C14, C51, C41 #6, E70): groups
// in the firmware's MCG table (hash chains kept by the driver), delivery to
// every attached QP on every port, and the sending HCA's own members.
#include "hca_fixture.h"

#include <cstring>

namespace mlx4x::test {
namespace {

constexpr uint32_t qkey = 0x1234;
constexpr uint32_t grh_size = 40;   ///< every UD receive starts with it

drv::gid mgid_of(uint16_t n)
{
    drv::gid g{};
    g[0] = 0xff;   // multicast prefix (IBA 4.1.1)
    g[1] = 0x12;   // link-local scope
    g[14] = uint8_t(n >> 8);
    g[15] = uint8_t(n);
    return g;
}

/// A UD QP with receive buffers, on its own context or beside another.
struct ud_member {
    std::unique_ptr<drv::qp> qp;
    std::vector<uint8_t>     buf = std::vector<uint8_t>(8 * 256);
    drv::mr                 *mr = nullptr;

    void create(endpoint &e, uint32_t key = qkey)
    {
        drv::qp_caps caps;
        caps.max_recv_wr = 8;
        caps.max_inline  = 64;
        auto q = drv::qp::create(*e.ctx, e.pd, drv::qp_type::ud, *e.scq, *e.rcq, caps);
        ASSERT_TRUE(q.ok());
        qp = q.take();
        ASSERT_EQ(qp->to_init(0, key), status::ok);
        ASSERT_EQ(qp->to_ud_rts(), status::ok);
        mr = &e.reg(buf.data(), buf.size());
        for (uint32_t i = 0; i < 8; ++i) {
            drv::sge s{reinterpret_cast<uint64_t>(buf.data() + 256 * i), 256, mr->lkey()};
            ASSERT_EQ(qp->post_recv(i, {&s, 1}), status::ok);
        }
    }
    /// Payload of receive `wr_id`.
    std::string payload(uint64_t wr_id, uint32_t len) const
    {
        return {reinterpret_cast<const char *>(buf.data() + 256 * wr_id + grh_size), len};
    }
};

class multicast : public ::testing::Test {
protected:
    void SetUp() override
    {
        manual_clock::now_ns = 1;
        for (endpoint *e : {&a, &b, &c}) {
            e->open(fab);
        }
        sender.create(a);
        on_b.create(b);
        on_c.create(c);
        auto h = drv::ah::create(*a.ctx, a.pd, {.dlid = mlid});
        ASSERT_TRUE(h.ok());
        to_group = h.take();
    }

    status send(const std::string &msg, drv::ah *dest = nullptr)
    {
        drv::sge s{reinterpret_cast<uint64_t>(msg.data()), uint32_t(msg.size()), 0};
        drv::send_wr wr;
        wr.flags   = drv::send_signaled | drv::send_inline;
        wr.sg      = {&s, 1};
        wr.ud_ah   = dest ? dest : to_group.get();
        wr.ud_dqpn = ib::multicast_qpn;
        wr.ud_qkey = qkey;
        return sender.qp->post_send(wr);
    }

    /// Runs every device until nothing moves, then collects completions.
    void settle()
    {
        for (int i = 0; i < 50; ++i) {
            for (endpoint *e : {&a, &b, &c}) {
                e->ctx->progress();
            }
        }
        for (endpoint *e : {&a, &b, &c}) {
            e->poll();
        }
    }

    fabric::loopback_fabric fab;
    endpoint a, b, c;
    ud_member sender, on_b, on_c;
    static constexpr uint16_t mlid = 0xc001;
    drv::gid group = mgid_of(1);
    std::unique_ptr<drv::ah> to_group;
};

// C14: the device reports its multicast limits (QUERY_DEV_CAP).
TEST_F(multicast, C14_device_reports_group_limits)
{
    EXPECT_EQ(a.ctx->multicast().max_groups, 1u << dev::limits::log_max_mcg);
    EXPECT_EQ(a.ctx->multicast().max_qps_per_group,
              1u << dev::limits::log_max_qp_per_mcg);
}

// C51: one datagram to the group's MLID reaches every attached QP on every
// other port; a QP that did not attach gets nothing.
TEST_F(multicast, C51_datagram_reaches_every_attached_qp)
{
    ASSERT_EQ(on_b.qp->attach_multicast(group, mlid), status::ok);
    ASSERT_EQ(on_c.qp->attach_multicast(group, mlid), status::ok);
    ud_member bystander;
    bystander.create(b);
    ASSERT_EQ(send("hello group"), status::ok);
    settle();
    ASSERT_EQ(a.send_wcs.size(), 1u);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    ASSERT_EQ(b.recv_wcs.size(), 1u);
    ASSERT_EQ(c.recv_wcs.size(), 1u);
    EXPECT_EQ(b.recv_wcs[0].qpn, on_b.qp->qpn());
    EXPECT_EQ(b.recv_wcs[0].byte_len, grh_size + 11);
    EXPECT_EQ(on_b.payload(b.recv_wcs[0].wr_id, 11), "hello group");
    EXPECT_EQ(on_c.payload(c.recv_wcs[0].wr_id, 11), "hello group");
    EXPECT_EQ(c.recv_wcs[0].src_qp, sender.qp->qpn());
}

// Several QPs of one HCA in the group each get a copy; so do members on
// the sending HCA itself (it delivers to its own QPs: the fabric never
// sends a frame back to its source port).
TEST_F(multicast, C51_every_member_of_a_port_and_of_the_sender_gets_a_copy)
{
    ud_member second_on_b, on_a;
    second_on_b.create(b);
    on_a.create(a);
    ASSERT_EQ(on_b.qp->attach_multicast(group, mlid), status::ok);
    ASSERT_EQ(second_on_b.qp->attach_multicast(group, mlid), status::ok);
    ASSERT_EQ(on_a.qp->attach_multicast(group, mlid), status::ok);
    ASSERT_EQ(send("x"), status::ok);
    settle();
    EXPECT_EQ(b.recv_wcs.size(), 2u);
    ASSERT_EQ(a.recv_wcs.size(), 1u);
    EXPECT_EQ(a.recv_wcs[0].qpn, on_a.qp->qpn());
}

// Each member checks the Q_Key itself (IBA 10.2.5, E40).
TEST_F(multicast, member_with_another_qkey_drops_the_datagram)
{
    ud_member other_key;
    other_key.create(c, qkey + 1);
    ASSERT_EQ(on_b.qp->attach_multicast(group, mlid), status::ok);
    ASSERT_EQ(other_key.qp->attach_multicast(group, mlid), status::ok);
    uint64_t violations = c.counter(dev::counter::qkey_violations);
    ASSERT_EQ(send("q"), status::ok);
    settle();
    EXPECT_EQ(b.recv_wcs.size(), 1u);
    EXPECT_TRUE(c.recv_wcs.empty());
    EXPECT_EQ(c.counter(dev::counter::qkey_violations), violations + 1);
}

// C51: after a detach the QP gets nothing more; the others still do.
TEST_F(multicast, C51_detach_stops_delivery)
{
    ASSERT_EQ(on_b.qp->attach_multicast(group, mlid), status::ok);
    ASSERT_EQ(on_c.qp->attach_multicast(group, mlid), status::ok);
    ASSERT_EQ(on_c.qp->detach_multicast(group), status::ok);
    ASSERT_EQ(send("after detach"), status::ok);
    settle();
    EXPECT_EQ(b.recv_wcs.size(), 1u);
    EXPECT_TRUE(c.recv_wcs.empty());
    EXPECT_EQ(on_c.qp->detach_multicast(group), status::invalid_param);
}

// A group nobody joined: the datagram is sent (UD) and simply lost.
TEST_F(multicast, datagram_to_an_empty_group_is_lost)
{
    ASSERT_EQ(send("nobody"), status::ok);
    settle();
    ASSERT_EQ(a.send_wcs.size(), 1u);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_TRUE(b.recv_wcs.empty());
    EXPECT_TRUE(c.recv_wcs.empty());
}

// E70: multicast is for UD QPs, multicast GIDs and multicast LIDs.
TEST_F(multicast, E70_attach_refuses_rc_qps_unicast_gids_and_lids)
{
    EXPECT_EQ(b.qp->attach_multicast(group, mlid), status::invalid_param);   // RC
    drv::gid unicast = group;
    unicast[0] = 0xfe;
    EXPECT_EQ(on_b.qp->attach_multicast(unicast, mlid), status::invalid_param);
    EXPECT_EQ(on_b.qp->attach_multicast(group, 0x0005), status::invalid_param);
    EXPECT_EQ(on_b.qp->attach_multicast(group, 0xffff), status::invalid_param);
}

// C14: one MLID per MGID.
TEST_F(multicast, C14_a_group_keeps_its_mlid)
{
    ASSERT_EQ(on_b.qp->attach_multicast(group, mlid), status::ok);
    EXPECT_EQ(on_c.qp->attach_multicast(group, mlid + 1), status::ok);   // another HCA's table
    ud_member second;
    second.create(b);
    EXPECT_EQ(second.qp->attach_multicast(group, mlid + 1), status::invalid_param);
    EXPECT_EQ(on_b.qp->attach_multicast(group, mlid), status::ok);       // twice: harmless
}

// C41 #6 / E70: destroying a QP detaches it from every group.
TEST_F(multicast, C41_destroyed_qp_leaves_its_groups)
{
    ASSERT_EQ(on_b.qp->attach_multicast(group, mlid), status::ok);
    ASSERT_EQ(on_b.qp->attach_multicast(mgid_of(2), mlid + 1), status::ok);
    on_b.qp.reset();
    // The group is gone from B's table: its MGID can take another MLID.
    ud_member again;
    again.create(b);
    EXPECT_EQ(again.qp->attach_multicast(group, mlid + 5), status::ok);
    ASSERT_EQ(send("gone"), status::ok);
    settle();
    EXPECT_TRUE(b.recv_wcs.empty());
}

// More groups than hash entries: the driver chains them (MGID_HASH,
// READ_MCG/WRITE_MCG), detaching from heads, middles and ends keeps every
// other group intact, and the table's end is exceeds_limit.
TEST_F(multicast, C51_hash_chains_survive_attach_and_detach_in_any_order)
{
    // Groups go to their hash head or, once it is taken, to a chain entry:
    // the table is full when the chain entries run out.
    uint32_t table = b.ctx->multicast().max_groups;
    uint16_t groups = 0;
    status s;
    while ((s = on_b.qp->attach_multicast(mgid_of(100 + groups),
                                          uint16_t(0xc100 + groups))) == status::ok) {
        ++groups;
    }
    EXPECT_EQ(s, status::exceeds_limit);
    EXPECT_GT(groups, table / 2);   // chains were used
    EXPECT_LE(groups, table);
    for (uint16_t n = 0; n < groups; n += 3) {
        ASSERT_EQ(on_b.qp->detach_multicast(mgid_of(100 + n)), status::ok) << n;
    }
    for (uint16_t n = 1; n < groups; n += 3) {   // still a member of these
        ASSERT_EQ(on_c.qp->attach_multicast(mgid_of(100 + n), uint16_t(0xc100 + n)),
                  status::ok);
    }
    // Delivery by MLID for a sample of the groups still joined and left.
    for (int n : {1, 2, 3, 4, 127, 128, groups - 2, groups - 1}) {
        size_t before = b.recv_wcs.size();
        auto h = drv::ah::create(*a.ctx, a.pd, {.dlid = uint16_t(0xc100 + n)});
        ASSERT_TRUE(h.ok());
        ASSERT_EQ(send("g", h->get()), status::ok);
        settle();
        EXPECT_EQ(b.recv_wcs.size() - before, n % 3 ? 1u : 0u) << n;
        // repost what was consumed
        for (size_t i = before; i < b.recv_wcs.size(); ++i) {
            uint64_t id = b.recv_wcs[i].wr_id;
            drv::sge s{reinterpret_cast<uint64_t>(on_b.buf.data() + 256 * id), 256,
                       on_b.mr->lkey()};
            ASSERT_EQ(on_b.qp->post_recv(id, {&s, 1}), status::ok);
        }
    }
    for (uint16_t n = 0; n < groups; ++n) {
        EXPECT_EQ(on_b.qp->detach_multicast(mgid_of(100 + n)),
                  n % 3 ? status::ok : status::invalid_param) << n;
    }
    // Everything free again: the same groups fit once more.
    for (uint16_t n = 0; n < groups; ++n) {
        ASSERT_EQ(on_b.qp->attach_multicast(mgid_of(100 + n), uint16_t(0xc100 + n)),
                  status::ok) << n;
    }
}

// C14: a group holds at most max_qps_per_group QPs.
TEST_F(multicast, C14_group_member_limit)
{
    uint32_t limit = b.ctx->multicast().max_qps_per_group;
    std::vector<ud_member> members(limit + 1);
    for (uint32_t i = 0; i <= limit; ++i) {
        members[i].create(b);
        EXPECT_EQ(members[i].qp->attach_multicast(group, mlid),
                  i < limit ? status::ok : status::exceeds_limit) << i;
    }
}

} // namespace
} // namespace mlx4x::test
