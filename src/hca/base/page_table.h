// SPDX-License-Identifier: BSD-3-Clause
// Pages entered into the process's page table ahead of their first use.
// A page's first touch by a process costs a fault (and, in this VM, a
// hidden one of the hypervisor's on top: ~4.5 us each, measured in
// docs/benchmarks.md, "First messages of a job"); memory the data path
// first touches message by message pays them in its first messages.
#pragma once

#include <cstddef>

namespace mlx4x {

/// Enters [p, p + len) into this process's page table, writable, in one
/// system call (MADV_POPULATE_WRITE, Linux 5.14+); pages the mapping does
/// not have yet are allocated. Best effort: false where the kernel refuses
/// (the pages then fault in at their first use, as without it).
bool map_for_writing(void *p, size_t len);

/// For memory no other thread or device uses yet: map_for_writing(), then
/// one byte of every page written with its own value, so that the
/// hypervisor's fault of a first access is taken here too (~5 us per
/// 2 MiB huge page in this VM, ~10 ns per page once mapped).
void first_touch(void *p, size_t len);

/// Whether the page holding `p` is in this process's page table (the
/// present bit of /proc/self/pagemap): a diagnostic, for tests.
bool page_mapped(const void *p);

} // namespace mlx4x
