// SPDX-License-Identifier: BSD-3-Clause
// What carries packets between device ports. A frame is the serialized IBA
// packet starting with its LRH; every fabric routes by LRH.DLID and carries
// the same bytes (one packet path: loopback may not skip the protocol).
#pragma once

#include "hca/base/copy.h"
#include "hca/base/status.h"
#include "hca/ib/ib_hdr.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>

namespace mlx4x::fabric {

namespace shm { class producer; }

constexpr size_t max_frame_size = 4096 + 128;   ///< 4 KiB MTU + headers

/// GUIDs of the fabric's HCA number `n` (Mellanox OUI): the node GUID has
/// a zero low byte and port 1's GUID follows it, as on ConnectX-3 cards,
/// so every HCA's node GUID is unique (the device reports the node GUID as
/// its port GUID with the low byte cleared).
constexpr uint64_t port_guid_of(uint64_t n)
{
    return 0x0002c90300000000ull | (n << 8) | 1;
}


/// Neighbour LIDs (fabric/roce.h), for ports on other hosts: 0x8000..0xBFFF, half of the unicast LIDs (IBA 4.1.1),
/// which the host's own subnet never assigns (shm_fabric::max_lid() is far
/// below). Telling them apart is one AND and compare on the send path.
constexpr uint16_t remote_lid_base  = 0x8000;
constexpr uint16_t remote_lid_count = 0x4000;
constexpr bool is_remote_lid(uint16_t lid) { return (lid & 0xc000) == remote_lid_base; }

/// Memory of one process: an address in its address space and a length.
struct mem_range {
    uint64_t addr;
    uint64_t len;
};

enum class copy_dir { from_peer, to_peer };

/// The other side of a single copy: its port, and its process as the QP's
/// connection named it (never as a packet or the fabric's port table does).
struct direct_peer {
    uint16_t lid = 0;
    int32_t  pid = 0;
};

/// Receives frames during port::poll(); the bytes are valid only during the
/// call.
class frame_sink {
public:
    /// Whether poll() goes on to the next frame: false after long work (a
    /// single-copy transfer of up to megabytes), so that the process sees
    /// its own completions and sends its own requests before it serves the
    /// next one.
    virtual bool on_frame(std::span<const uint8_t> frame) = 0;
protected:
    ~frame_sink() = default;
};

/// Room for one frame, reserved by port::reserve() and written in place.
struct frame_slot {
    uint8_t *data = nullptr;   ///< `len` writable bytes
    size_t   len  = 0;
    uint64_t pos  = 0;         ///< the fabric's bookkeeping
    uint16_t dlid = 0;
    bool     wake = false;     ///< the owner sleeps: commit() wakes it
};

/// A device port attached to a fabric.
class port {
public:
    virtual ~port() = default;
    /// LID the subnet assigned to this port.
    virtual uint16_t lid() const = 0;
    virtual uint64_t port_guid() const = 0;
    /// Send one frame = header bytes followed by payload bytes. Returns
    /// no_resource when the destination's receive ring is full (back-pressure:
    /// nothing was sent, try again later) and unreachable when no live port
    /// has the destination LID.
    virtual status send(std::span<const uint8_t> hdr,
                        std::span<const uint8_t> payload) = 0;
    /// The same for a unicast frame of `len` bytes the caller writes in
    /// place (on the shm fabric: straight into the destination's receive
    /// ring, no staging copy). ok: write `f.data`, then commit(f), which
    /// returns what send() would have (the frame is gone only if ok).
    /// no_resource / unreachable from either as from send(). The base
    /// version stages the frame and sends it at commit.
    virtual status reserve(uint16_t dlid, size_t len, frame_slot &f)
    {
        if (len > staged_.size()) {
            return status::unreachable;
        }
        f = {staged_.data(), len, 0, dlid};
        return status::ok;
    }
    virtual status commit(const frame_slot &f) { return send({f.data, f.len}, {}); }
    /// Frames sent from begin_batch() to end_batch() may wait in the port
    /// and leave together (across hosts: one UDP GSO datagram for a run of
    /// equal-sized packets to one peer, fabric/roce.h), each still
    /// reported sent. The device brackets a burst of one QP's packets.
    /// end_batch() sends what waits; no_resource: the socket had no room,
    /// and the port sends it first thing at its next send or poll (the
    /// device comes back as for a pushed-back frame).
    virtual void   begin_batch() {}
    virtual status end_batch() { return status::ok; }
    /// send() of a whole unicast frame from another thread while the owner
    /// goes on using the port (the device's ACK watchdog), where
    /// sends_concurrently(); unsupported elsewhere.
    virtual bool   sends_concurrently() const { return false; }
    virtual status send_concurrent(std::span<const uint8_t> /*frame*/)
    {
        return status::unsupported;
    }
    /// Multicast membership of this port, what the SM programs into the
    /// switches' multicast forwarding tables (IBA 18.2.4.3.3): a frame to a
    /// multicast LID goes to every member port except the sender's (the
    /// sending HCA delivers to its own QPs itself). Unreliable, as UD is:
    /// a member whose ring is full misses the frame; a group without
    /// members drops it. exceeds_limit: the port is in too many groups.
    virtual status join_multicast(uint16_t mlid) = 0;
    virtual void   leave_multicast(uint16_t mlid) = 0;
    /// The shared-memory fabric's sending side (reserve() and commit()
    /// without a virtual call, for the device's small sends); nullptr on
    /// other fabrics.
    virtual shm::producer *shm_producer() { return nullptr; }
    /// Deliver up to `budget` received frames to `sink`, fewer if it asks
    /// to stop (frame_sink::on_frame); returns how many.
    /// Their room stays taken, and they count as not delivered (see
    /// delivered()), until release(): a device releases the frames once it
    /// has sent the answers they call for, so that a sender waiting for an
    /// ACK the receiver still owes sees a peer that has not progressed, not
    /// one that dropped its packets.
    virtual unsigned poll(frame_sink &sink, unsigned budget) = 0;
    /// Gives back the room of every frame poll() delivered.
    virtual void release() {}
    /// Whether poll() may find a frame: false only when it surely finds
    /// none (the default cannot tell).
    virtual bool frame_waiting() const { return true; }
    /// The frame poll() would deliver next, left where it is: true and
    /// `frame` (empty for a malformed one) when there is one; false when
    /// there is none or the fabric cannot tell. Off the data path: the
    /// device's watchdog looks before it takes (device::serve_slice).
    virtual bool peek(std::span<const uint8_t> & /*frame*/) const { return false; }
    /// poll() of only the frames whose senders may lose packets (other
    /// hosts: not lossless()), leaving the lossless ones' ring as it is:
    /// the device's watchdog, holding a frame of this host back, still
    /// takes those of other hosts, whose senders would spend their retries
    /// waiting.
    virtual unsigned poll_lossy(frame_sink & /*sink*/, unsigned /*budget*/) { return 0; }
    /// Whether a port with this LID is attached and its owner alive.
    virtual bool peer_alive(uint16_t lid) const = 0;
    /// Where the port at `lid` is, for diagnostics ("10.0.0.2:4791" on
    /// another host); empty on this fabric.
    virtual std::string where(uint16_t /*lid*/) const { return {}; }
    /// True when frames between this port and the live port `lid` are
    /// never lost (full rings push back instead). A missing ACK from a live
    /// peer then means the peer is not progressing, not that a packet was
    /// lost.
    virtual bool lossless(uint16_t lid) const = 0;
    /// A link that loses packets and knows its round trip names a
    /// retransmission timeout for packets to `lid`: the device sends again
    /// after it (doubling per expiry) instead of only after the IBA ACK
    /// timeout, which still counts retries and tells a dead peer. 0: the
    /// ACK timeout only.
    virtual uint32_t retransmit_timeout_ns(uint16_t /*lid*/) const { return 0; }
    /// Packets the link dropped as damaged before the device saw them (a
    /// RoCEv2 datagram whose ICRC is wrong, or too short to be a packet):
    /// PortRcvErrors beside the device's own (IBA 16.1.3.5).
    virtual uint64_t link_errors() const { return 0; }
    /// Whether every frame this port sent to `lid` has been taken off the
    /// fabric and released by that port's owner: an answer still missing
    /// then was not held up but dropped by the peer (no such QP, say).
    /// False when the fabric cannot tell.
    virtual bool delivered(uint16_t /*lid*/) const { return false; }

    // Single-copy transfers: the host's DMA engine between the processes of
    // two ports. A responder that has validated a direct RDMA request (key,
    // rights, bounds) moves its payload between its own memory and the
    // requester's in one copy instead of packets through the fabric.
    /// Smallest message worth a direct transfer with port `lid`; 0: never
    /// (direct transfers off, or this process cannot reach that one's memory).
    virtual uint64_t direct_min(uint16_t /*lid*/) { return 0; }
    /// Below direct_min(), the smallest message for which the device
    /// measures both ways and takes the faster (engine::direct_chooser); 0:
    /// packets below direct_min().
    virtual uint64_t direct_try_min(uint16_t /*lid*/) { return 0; }
    /// Copies between `local` (ranges of this process) and `remote` (ranges
    /// of process `peer.pid`, which owns port `peer.lid`), each list in
    /// order; both add up to the same length. ok: every byte moved;
    /// unsupported: not all of them (no access to that process, or a range
    /// not mapped on either side), and no byte may be counted on.
    virtual status direct_copy(direct_peer /*peer*/, copy_dir /*dir*/,
                               std::span<const mem_range> /*local*/,
                               std::span<const mem_range> /*remote*/)
    {
        return status::unsupported;
    }

    // The fabric's interrupt line, for a device that sleeps when idle (the
    // engine thread, or a driver blocked in interrupt mode).
    /// A descriptor that becomes readable when a frame arrives after
    /// arm_wakeup(); -1 if this fabric has none (then never sleep on it).
    virtual int wakeup_fd() const { return -1; }
    /// Clears old wake-ups and asks senders to signal wakeup_fd() at the
    /// next frame. False when a frame is already waiting: do not sleep.
    virtual bool arm_wakeup() { return false; }

protected:
    /// send() for a port whose frames are written in place: reserve(),
    /// the header and payload copied in, commit().
    status send_in_place(uint16_t dlid, std::span<const uint8_t> hdr,
                         std::span<const uint8_t> payload)
    {
        frame_slot f;
        if (status s = reserve(dlid, hdr.size() + payload.size(), f); s != status::ok) {
            return s;
        }
        std::memcpy(f.data, hdr.data(), hdr.size());
        if (!payload.empty()) {
            copy_bytes(f.data + hdr.size(), payload.data(), payload.size());
        }
        return commit(f);
    }

private:
    std::array<uint8_t, max_frame_size> staged_;   ///< reserve()'s default
};

class fabric {
public:
    virtual ~fabric() = default;
    virtual result<std::unique_ptr<port>> attach() = 0;
    /// Tells fabrics apart (random at creation): ports with different ids
    /// cannot reach each other, however alike their LIDs.
    virtual uint64_t fabric_id() const = 0;
};

/// LID carried in a frame's LRH (bytes 2..3, big-endian).
inline uint16_t frame_dlid(std::span<const uint8_t> hdr)
{
    return static_cast<uint16_t>((hdr[2] << 8) | hdr[3]);
}

} // namespace mlx4x::fabric
