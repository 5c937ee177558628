// SPDX-License-Identifier: BSD-3-Clause
#include "mad/sm.h"

#include "hca/base/log.h"
#include "hca/base/private_file.h"
#include "hca/fabric/shm_fabric.h"
#include "hca/fw/device_sma.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <thread>
#include <unistd.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>

namespace mlx4x::mad {

result<std::unique_ptr<subnet_manager>> subnet_manager::create(fabric::fabric &fab,
                                                               std::string lock_path,
                                                               smi_client::idle_fn idle)
{
    // Private, as the fabric: another user holding its lock would keep
    // every candidate from ever becoming master.
    auto f = open_private(lock_path, open_how::open_or_create, "SM lock");
    if (!f.ok()) {
        return f.error();
    }
    return std::unique_ptr<subnet_manager>(
        new subnet_manager(fab, f->fd, std::move(lock_path), std::move(idle)));
}

subnet_manager::~subnet_manager()
{
    smi_.reset();
    ctx_.reset();
    close(lock_fd_);   // releases mastership
}

/// Whether the lock just taken is the fabric's: the fabric's last port
/// removes the lock file with the segment, and a candidate that opened it
/// before must not be a second master beside one holding the new file's
/// lock. Otherwise the lock is dropped and the file opened again.
bool subnet_manager::lock_is_current()
{
    struct stat held {}, now {};
    if (fstat(lock_fd_, &held) == 0 && stat(lock_path_.c_str(), &now) == 0 &&
        held.st_dev == now.st_dev && held.st_ino == now.st_ino) {
        return true;
    }
    (void)flock(lock_fd_, LOCK_UN);
    auto f = open_private(lock_path_, open_how::open_or_create, "SM lock");
    if (f.ok()) {
        close(lock_fd_);
        lock_fd_ = f->fd;
    }
    return false;
}

bool subnet_manager::try_master()
{
    if (master()) {
        return true;
    }
    // flock: per open file description, so two candidates in one process
    // exclude each other too, and the lock dies with its holder.
    if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
        return false;
    }
    if (!lock_is_current()) {
        return false;   // the next try takes the new file's lock
    }
    auto c = drv::context::open(fab_, nullptr, std::make_unique<device_sma>());
    if (!c.ok()) {
        MLX4X_ERROR("sm: no HCA for the master: %s", to_string(c.error()));
        (void)flock(lock_fd_, LOCK_UN);
        return false;
    }
    auto s = smi_client::create(**c, idle_);
    if (!s.ok()) {
        MLX4X_ERROR("sm: no QP0: %s", to_string(s.error()));
        (void)flock(lock_fd_, LOCK_UN);
        return false;
    }
    ctx_ = c.take();
    smi_ = s.take();
    smi_->on_trap([this](uint16_t lid, const smp &t) {
        notice n;
        std::memcpy(&n, t.data, sizeof(n));
        MLX4X_DIAG("sm: trap %u from lid %u", unsigned(n.trap_num.get()), lid);
        traps_.push_back({lid, n.trap_num.get()});
    });
    MLX4X_DIAG("sm: master on lid %u", lid());
    return true;
}

uint16_t subnet_manager::lid() const
{
    return ctx_ ? ctx_->port().lid : 0;
}

subnet_manager::sweep_report subnet_manager::sweep(uint16_t max_lid)
{
    sweep_report r;
    if (!master()) {
        return r;
    }
    std::set<uint16_t> seen;
    auto answers = smi_->sweep(smp_attr::port_info, max_lid, smi_client::duration(20), 2);
    if (smi_->aborted()) {
        return r;   // shutting down: what it heard is not the subnet
    }
    for (const auto &[lid, answer] : answers) {
        if (answer.hdr.status.get() != 0) {
            continue;
        }
        seen.insert(lid);
        r.ports.push_back(lid);
        port_info pi;
        std::memcpy(&pi, answer.data, sizeof(pi));
        auto state = static_cast<logical_state>(pi_port_state::get(pi.speed_sup_state));
        if (pi.lid.get() == lid && pi.sm_lid.get() == this->lid() &&
            state == logical_state::active) {
            continue;   // up, and knows its master
        }
        (bring_up(lid, answer) ? r.brought_up : r.failed).push_back(lid);
    }
    for (uint16_t lid : known_) {
        if (!seen.count(lid)) {
            r.gone.push_back(lid);
            MLX4X_DIAG("sm: lid %u gone", lid);
        }
    }
    known_ = std::move(seen);
    r.traps = std::move(traps_);
    traps_.clear();
    return r;
}

/// IBA 14.4.5: in INIT the port gets its LID and MasterSMLID; then ARMED,
/// then ACTIVE. A port already ACTIVE only learns the (new) master.
bool subnet_manager::bring_up(uint16_t lid, const smp &port_info_resp)
{
    port_info pi;
    std::memcpy(&pi, port_info_resp.data, sizeof(pi));
    auto state = static_cast<logical_state>(pi_port_state::get(pi.speed_sup_state));
    smp current = port_info_resp;
    auto set = [&](logical_state to) {
        smp req = port_info_set_from_get(current, [&](port_info &p) {
            p.lid.set(lid);
            p.sm_lid.set(this->lid());
            pi_port_state::set(p.speed_sup_state, static_cast<uint8_t>(to));
        });
        auto resp = smi_->request(lid, req, smi_client::duration(50), 3);
        if (!resp || resp->hdr.status.get() != 0) {
            return false;
        }
        current = *resp;
        return true;
    };
    switch (state) {
    case logical_state::init:
        return set(logical_state::nop) && set(logical_state::armed) &&
               set(logical_state::active);
    case logical_state::armed:
        return set(logical_state::active);
    case logical_state::active:
        return set(logical_state::nop);
    default:
        return false;   // DOWN: no link to bring up
    }
}

// ---- sm_service -----------------------------------------------------------

result<std::shared_ptr<sm_service>> sm_service::start(const std::string &fabric_name,
                                                      std::chrono::milliseconds period)
{
    auto s = std::make_shared<sm_service>();
    auto f = fabric::shm_fabric::open(fabric_name);
    if (!f.ok()) {
        return f.error();
    }
    s->fabric_ = f.take();
    // Waiting for answers, it sleeps a millisecond at a time: every
    // wake-up takes a core from a rank (an SMP answer is not urgent).
    // A sweep waits 2 x 20 ms for LIDs nobody holds; a service being
    // closed stops waiting at once, so that closing a device (whose
    // last user the service may be) does not wait out a sweep.
    auto nap = [raw = s.get()] {
        if (raw->stopping_.load(std::memory_order_relaxed)) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return true;
    };
    auto sm  = subnet_manager::create(*s->fabric_,
                                      fabric::shm_fabric::path_of(fabric_name, ".sm"), nap);
    if (!sm.ok()) {
        return sm.error();
    }
    s->sm_ = sm.take();
    s->thread_ = std::thread([raw = s.get(), period] { raw->run(period); });
    return s;
}

void sm_service::run(std::chrono::milliseconds period)
{
    // The background of the application's threads: MPI ranks busy-poll
    // one per core, and an SM thread of normal priority that woke to sweep
    // preempted one (docs/benchmarks.md, "Measured reasons in the code").
    // At nice 19 it takes what the ranks leave, and a sweep every period
    // needs little.
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
    std::unique_lock g(mu_);
    while (!stop_) {
        g.unlock();
        if (sm_->try_master()) {
            auto r = sm_->sweep(fabric::shm_fabric::max_lid());
            for (uint16_t lid : r.gone) {
                MLX4X_DEBUG("sm: lid %u gone", lid);
            }
        }
        g.lock();
        wake_.wait_for(g, period, [this] { return stop_; });
    }
}

sm_service::~sm_service()
{
    stopping_.store(true, std::memory_order_relaxed);   // ends a sweep's wait
    {
        std::lock_guard g(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
    sm_.reset();   // its port and the lock, before the fabric
}

} // namespace mlx4x::mad
