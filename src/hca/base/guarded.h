// SPDX-License-Identifier: BSD-3-Clause
// Memory accesses that may meet an unmapped page, and fail instead of
// killing the process.
//
// A ConnectX-3 reads and writes a registered region through pages the
// kernel pinned at registration (C53): the region's memory stays there
// until it is deregistered, whatever the process unmaps. This
// device reaches the region through the process's own mappings, which
// nothing pins. And a region outlives its memory for a while: UCX's
// registration cache deregisters a region whose memory was unmapped only
// at its next cleanup. Through such a region a peer's READ, WRITE or
// atomic, a late duplicate of one, or a packet sent again for a message
// the application already let go, meets an unmapped page. The device then
// does what an HCA does with a page it cannot reach: it fails that access
// (for a peer: the remote access NAK of a bad R_Key, E28), and the
// process lives on.
//
// How: a SIGSEGV/SIGBUS handler, installed once per process the first
// time a guard is used (after the application's and UCX's own handlers,
// to which every fault outside a guard is passed on), jumps back out of
// the access in progress. A guarded access costs a sigsetjmp() without
// the signal mask and two thread-local stores.
#pragma once

#include <cstddef>

namespace mlx4x {

/// memcpy(dst, src, n); false when a page of either was not mapped (or
/// not writable), with part of `dst` written.
bool guarded_copy(void *dst, const void *src, size_t n);

/// Whether every page of [p, p + n) can be read (and, with `write`,
/// written: probed by a compare-exchange of a byte with itself, which
/// leaves the memory as it was). For an access that cannot fail
/// half-way, such as a copy into a frame already reserved in a peer's
/// ring: probed first, then done.
bool guarded_probe(const void *p, size_t n, bool write);

} // namespace mlx4x
