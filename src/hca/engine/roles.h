// SPDX-License-Identifier: BSD-3-Clause
// The transport engine's roles, each an object with its own state that
// reaches the device's shared state (dev::core) and the roles it hands
// work to by reference; dev::device owns them all and wires them. Who
// calls whom (each also calls dev::core):
//
//   ingress     -> responder (requests), completer (ACKs, responses)
//   responder   -> egress, tag_matcher (tagged SENDs), completer
//   requester   -> egress, completer (ACK timer), tag_matcher (list ops)
//   completer   -> requester (rewind, single-copy posts), tag_matcher
//   tag_matcher -> requester (its own READs), responder
//   egress      -> ingress (multicast looped back to this HCA)
//
// and dev::firmware calls the requester, responder and completer at QP
// transitions.
#pragma once

#include "hca/core/core.h"

namespace mlx4x::engine {

class ingress;
class egress;
class requester;
class responder;
class completer;
class tag_matcher;

// The device's objects and shared types, as the roles name them.
using dev::counter;
using dev::cq;
using dev::limits;
using dev::mpt;
using dev::qp;
using dev::resp_message;
using dev::resp_resource;
using dev::scatter_result;
using dev::srq;
using dev::timed_transfer;
using dev::tm_rndv;
using dev::tx_packet;
using dev::wqe_track;
using dev::dma;
using dev::counter_of;
using dev::timer_at_next_slice;
using dev::read_request_packets;

} // namespace mlx4x::engine
