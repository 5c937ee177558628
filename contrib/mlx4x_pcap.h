// SPDX-License-Identifier: BSD-3-Clause
// The capture file mlx4x-dump writes: libpcap's classic format (host byte
// order, microsecond stamps). Each record is, by default, an ERF record of
// type InfiniBand (link type 197, DLT_ERF; ERF type 21), as Mellanox's
// ibdump writes them and Wireshark decodes them; with --dlt-infiniband, the
// bare frame (link type 247, DLT_INFINIBAND: the frame from the LRH on),
// which Wireshark 4.0 does not read. Either way the frame ends with its
// ICRC and VCRC as on a link (IBA 7.8; Wireshark's InfiniBand dissector
// takes the last 6 bytes for them).
#pragma once

#include "hca/base/endian.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::pcap {

constexpr uint32_t magic_usec      = 0xa1b2c3d4;
constexpr uint32_t linktype_erf    = 197;   ///< DLT_ERF
constexpr uint32_t linktype_ib     = 247;   ///< DLT_INFINIBAND
constexpr uint8_t  erf_type_ib     = 21;    ///< ERF_TYPE_INFINIBAND
constexpr uint8_t  erf_flag_vlen   = 0x04;  ///< variable-length record

/// The file header (host order).
struct file_header {
    uint32_t magic;
    uint16_t version_major;   ///< 2
    uint16_t version_minor;   ///< 4
    int32_t  thiszone;
    uint32_t sigfigs;
    uint32_t snaplen;
    uint32_t linktype;
};
static_assert(sizeof(file_header) == 24);

/// Each record's header (host order).
struct record_header {
    uint32_t ts_sec;
    uint32_t ts_usec;
    uint32_t incl_len;
    uint32_t orig_len;
};
static_assert(sizeof(record_header) == 16);

/// ERF record header: the timestamp little-endian (32.32 fixed point
/// seconds), the rest big-endian.
struct erf_header {
    uint64_t ts_le;
    uint8_t  type;
    uint8_t  flags;
    be16     rlen;   ///< the record: this header and the frame
    be16     lctr;   ///< loss counter: frames lost before this one
    be16     wlen;   ///< the frame's length on the wire
};
static_assert(sizeof(erf_header) == 16);

} // namespace mlx4x::pcap
