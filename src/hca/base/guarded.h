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
//
// The access itself is guarded, never a probe before it: whether a page
// is mapped is an answer for its moment only, and the application may
// unmap from any of its threads (or this device's engine thread copies
// beside them) between a probe and the access: a fault there kills the
// process. (A READ's responder used to probe and then copy: the likely
// cause of a crash seen once in UCX's get_zcopy test across two hosts,
// where the engine thread answers while the test's thread frees memory.)
#pragma once

#include <cstddef>
#include <type_traits>

namespace mlx4x {

/// memcpy(dst, src, n); false when a page of either was not mapped (or
/// not writable), with part of `dst` written.
bool guarded_copy(void *dst, const void *src, size_t n);

/// Runs `fn(arg)`; false when it met a page not mapped (or not writable),
/// with whatever it did before that done.
bool guarded_call(void (*fn)(void *), void *arg);

/// guarded_call() for a callable: `access()`, false when it faulted.
template <typename F> bool guarded_run(F &&access)
{
    using callable = std::remove_reference_t<F>;
    return guarded_call([](void *f) { (*static_cast<callable *>(f))(); }, &access);
}

} // namespace mlx4x
