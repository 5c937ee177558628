// SPDX-License-Identifier: BSD-3-Clause
// Communication Management messages (IBA Vol.1 ch.12, 12.6): the REQ, MRA,
// REJ, REP, RTU, DREQ and DREP attributes of management class 0x07, each
// the 232 bytes after the common MAD header, sent with method Send on QP1
// (Q_Key 0x80010000). Big-endian; sub-byte fields through bits<> (shifts
// count from the least significant bit of the containing word).
#pragma once

#include "hca/ib/ib_mad.h"

namespace mlx4x::mad::cm {

constexpr uint8_t  class_version = 2;              ///< IBA 12.6.1
constexpr uint32_t gsi_qkey      = 0x80010000u;    ///< QP1's well-known Q_Key
constexpr size_t   msg_size      = mad_size - sizeof(mad_hdr);   ///< 232

/// AttributeID of each CM message (IBA table 96).
enum class attr : uint16_t {
    req  = 0x0010,
    mra  = 0x0011,
    rej  = 0x0012,
    rep  = 0x0013,
    rtu  = 0x0014,
    dreq = 0x0015,
    drep = 0x0016,
};

/// REJ reason codes (IBA table 112), the ones mlx4x sends or handles.
enum class reject_reason : uint16_t {
    no_qp                 = 1,
    no_resources          = 3,
    timeout               = 4,
    unsupported_request   = 5,
    invalid_comm_id       = 6,
    invalid_service_id    = 8,
    invalid_transport     = 9,
    stale_connection      = 10,
    consumer_reject       = 28,
};

/// Which message a REJ or MRA refers to (MessageREJected / MessageMRAed).
enum class msg_ref : uint8_t { req = 0, rep = 1, other = 2 };

/// One path (IBA table 99, bytes 52..95 of the REQ for the primary path).
struct path {
    be16    local_lid;          ///< 0
    be16    remote_lid;         ///< 2
    uint8_t local_gid[16];      ///< 4
    uint8_t remote_gid[16];     ///< 20
    be32    flow_label_rate;    ///< 36: [31:12] flow label, [5:0] packet rate
    uint8_t traffic_class;      ///< 40
    uint8_t hop_limit;          ///< 41
    be8     sl_subnet_local;    ///< 42: [7:4] SL, [3] subnet local
    be8     ack_timeout;        ///< 43: [7:3] local ACK timeout
};
static_assert(sizeof(path) == 44);
using path_sl            = bits<be8, 4, 4>;
using path_subnet_local  = bits<be8, 3, 1>;
using path_ack_timeout   = bits<be8, 3, 5>;

/// REQ (IBA 12.6.5, table 99).
struct req {
    be32    local_comm_id;        ///< 0
    be32    reserved0;            ///< 4
    be64_split service_id;        ///< 8
    be64_split local_ca_guid;     ///< 16
    be32    reserved1;            ///< 24
    be32    local_qkey;           ///< 28
    be32    local_qpn_resp_res;   ///< 32: [31:8] QPN, [7:0] responder resources
    be32    local_eecn_init_depth;///< 36: [31:8] EECN, [7:0] initiator depth
    be32    remote_eecn_timeout;  ///< 40: [31:8] EECN, [7:3] remote CM response
                                  ///<     timeout, [2:1] transport, [0] flow ctl
    be32    psn_timeout_retry;    ///< 44: [31:8] starting PSN, [7:3] local CM
                                  ///<     response timeout, [2:0] retry count
    be16    pkey;                 ///< 48
    be8     mtu_rdc_rnr;          ///< 50: [7:4] path MTU, [3] RDC, [2:0] RNR retry
    be8     max_retries_srq;      ///< 51: [7:4] max CM retries, [3] SRQ
    path    primary;              ///< 52
    path    alternate;            ///< 96
    uint8_t private_data[92];     ///< 140
};
static_assert(sizeof(req) == msg_size);
static_assert(offsetof(req, service_id) == 8);
static_assert(offsetof(req, local_qkey) == 28);
static_assert(offsetof(req, psn_timeout_retry) == 44);
static_assert(offsetof(req, pkey) == 48);
static_assert(offsetof(req, primary) == 52);
static_assert(offsetof(req, alternate) == 96);
static_assert(offsetof(req, private_data) == 140);
using req_qpn              = bits<be32, 8, 24>;
using req_resp_resources   = bits<be32, 0, 8>;
using req_init_depth       = bits<be32, 0, 8>;
using req_remote_timeout   = bits<be32, 3, 5>;
using req_transport        = bits<be32, 1, 2>;   ///< 0: RC
using req_psn              = bits<be32, 8, 24>;
using req_local_timeout    = bits<be32, 3, 5>;
using req_retry_count      = bits<be32, 0, 3>;
using req_mtu              = bits<be8, 4, 4>;    ///< ib_mtu
using req_rnr_retry        = bits<be8, 0, 3>;
using req_max_cm_retries   = bits<be8, 4, 4>;
using req_srq              = bits<be8, 3, 1>;

/// MRA (IBA 12.6.6, table 102).
struct mra {
    be32    local_comm_id;        ///< 0
    be32    remote_comm_id;       ///< 4
    be8     msg_mraed;            ///< 8: [7:6] msg_ref
    be8     service_timeout;      ///< 9: [7:3]
    uint8_t private_data[222];    ///< 10
};
static_assert(sizeof(mra) == msg_size);
using mra_msg             = bits<be8, 6, 2>;
using mra_service_timeout = bits<be8, 3, 5>;

/// REJ (IBA 12.6.7, table 103).
struct rej {
    be32    local_comm_id;        ///< 0
    be32    remote_comm_id;       ///< 4
    be8     msg_rejected;         ///< 8: [7:6] msg_ref
    be8     info_length;          ///< 9: [7:1] ARI length
    be16    reason;               ///< 10
    uint8_t ari[72];              ///< 12: additional reject information
    uint8_t private_data[148];    ///< 84
};
static_assert(sizeof(rej) == msg_size);
static_assert(offsetof(rej, reason) == 10);
static_assert(offsetof(rej, private_data) == 84);
using rej_msg = bits<be8, 6, 2>;

/// REP (IBA 12.6.8, table 104).
struct rep {
    be32    local_comm_id;        ///< 0
    be32    remote_comm_id;       ///< 4
    be32    local_qkey;           ///< 8
    be32    local_qpn;            ///< 12: [31:8]
    be32    local_eecn;           ///< 16: [31:8]
    be32    starting_psn;         ///< 20: [31:8]
    uint8_t resp_resources;       ///< 24
    uint8_t init_depth;           ///< 25
    be8     ack_delay_failover;   ///< 26: [7:3] target ACK delay, [2:1], [0] flow ctl
    be8     rnr_retry_srq;        ///< 27: [7:5] RNR retry, [4] SRQ
    be64_split local_ca_guid;     ///< 28 (only 4-byte aligned)
    uint8_t private_data[196];    ///< 36
};
static_assert(sizeof(rep) == msg_size);
static_assert(offsetof(rep, local_ca_guid) == 28);
static_assert(offsetof(rep, private_data) == 36);
using rep_qpn       = bits<be32, 8, 24>;
using rep_psn       = bits<be32, 8, 24>;
using rep_rnr_retry = bits<be8, 5, 3>;
using rep_srq       = bits<be8, 4, 1>;

/// RTU (IBA 12.6.9), DREP (12.6.11): the comm IDs and private data.
struct rtu {
    be32    local_comm_id;        ///< 0
    be32    remote_comm_id;       ///< 4
    uint8_t private_data[224];    ///< 8
};
static_assert(sizeof(rtu) == msg_size);
using drep = rtu;

/// DREQ (IBA 12.6.10).
struct dreq {
    be32    local_comm_id;        ///< 0
    be32    remote_comm_id;       ///< 4
    be32    remote_qpn;           ///< 8: [31:8]
    uint8_t private_data[220];    ///< 12
};
static_assert(sizeof(dreq) == msg_size);
using dreq_qpn = bits<be32, 8, 24>;

/// The header IP-addressed connection set-up puts at the start of a REQ's
/// private data (IBA Annex A11, RDMA IP CM Service; the kernel's rdma_cm
/// writes it as struct cma_hdr): version, IP version, the source port and
/// both addresses. An IPv4 address sits in the last 4 bytes of its field.
struct ip_cm_hdr {
    be8     version;              ///< 0: MajV [7:4], MinV [3:0] (0.0)
    be8     ip_version;           ///< 1: [7:4] = 4 or 6
    be16    src_port;             ///< 2
    uint8_t src_addr[16];         ///< 4
    uint8_t dst_addr[16];         ///< 20
};
static_assert(sizeof(ip_cm_hdr) == 36);
/// Room for the consumer's data after the header in a REQ (as rdma_cm's
/// 56 bytes for RDMA_PS_TCP), and in a REP.
constexpr size_t ip_req_private_room = sizeof(req::private_data) - sizeof(ip_cm_hdr);
constexpr size_t ip_rep_private_room = sizeof(rep::private_data);
static_assert(ip_req_private_room == 56 && ip_rep_private_room == 196);

} // namespace mlx4x::mad::cm
