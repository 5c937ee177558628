// SPDX-License-Identifier: BSD-3-Clause
// The fault handler behind guarded.h: a thread in a guarded access has its
// jump buffer in `active`; a fault there jumps back to it, any other is
// the business of the handler installed before this one.
#include "hca/base/guarded.h"
#include "hca/base/copy.h"

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <utility>

namespace mlx4x {

namespace {

struct fault_guard {
    sigjmp_buf env;
};

/// Initial-exec: the handler reads it in any thread, and a dynamic TLS
/// block may not be there yet in a thread that never took a guard (its
/// allocation is not async-signal-safe).
[[gnu::tls_model("initial-exec")]] thread_local fault_guard *active = nullptr;

struct sigaction before_segv, before_bus;   // the handlers this one passes on to

void on_fault(int sig, siginfo_t *info, void *context)
{
    if (fault_guard *g = active) {
        active = nullptr;
        siglongjmp(g->env, 1);   // the mask is as it was: SA_NODEFER
    }
    const struct sigaction &before = sig == SIGBUS ? before_bus : before_segv;
    if (before.sa_flags & SA_SIGINFO) {
        before.sa_sigaction(sig, info, context);
    } else if (before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN) {
        before.sa_handler(sig);
    } else {
        // The default action: the faulting instruction runs again into it.
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, nullptr);
    }
}

void install()
{
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa {};
        sa.sa_sigaction = on_fault;
        // SA_NODEFER: the jump out leaves the signal unblocked for the
        // next guarded fault, without saving and restoring the mask.
        sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &before_segv);
        sigaction(SIGBUS, &sa, &before_bus);
    });
}

/// A library unloaded with its handler installed would leave the process
/// a handler that is no longer mapped.
[[gnu::destructor]] void uninstall()
{
    for (auto [sig, before] : {std::pair{SIGSEGV, &before_segv}, std::pair{SIGBUS, &before_bus}}) {
        struct sigaction now {};
        if (sigaction(sig, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) &&
            now.sa_sigaction == on_fault) {
            sigaction(sig, before, nullptr);
        }
    }
}

/// Runs `access` with faults turned into a false return.
/// Not inlined (a function that calls sigsetjmp() cannot be): its frame
/// is the one the jump returns to.
template <typename F> bool guarded(F &&access)
{
    install();
    fault_guard g;
    if (sigsetjmp(g.env, 0) != 0) {
        return false;
    }
    active = &g;
    std::atomic_signal_fence(std::memory_order_seq_cst);   // armed before the access
    access();
    std::atomic_signal_fence(std::memory_order_seq_cst);   // disarmed after it
    active = nullptr;
    return true;
}

} // namespace

bool guarded_copy(void *dst, const void *src, size_t n)
{
    return n == 0 || guarded([&] { copy_bytes(dst, src, n); });
}

bool guarded_call(void (*fn)(void *), void *arg)
{
    return guarded([&] { fn(arg); });
}

} // namespace mlx4x
