// SPDX-License-Identifier: BSD-3-Clause
// The subnet manager (IBA 14.4): exactly one master per fabric. Mastership
// is an exclusive lock on the fabric's SM file: the first candidate to take
// it is the master, and because the kernel drops the lock when its holder
// exits, however it exits (kill -9 included), the next candidate to try
// takes over: the hand-over of IBA 14.4.1, with the lock standing in for
// SMInfo polling between SMs.
//
// The master has an HCA port of its own (an SM node) and sweeps the
// fabric's LIDs over QP0. The in-host fabrics route by the LID slot a port
// attached to, as a switch routes by port number, so the sweep reaches
// ports whose SMA has no LID yet; every port found is brought up as
// IBA 14.4.5 orders it: LID and MasterSMLID set in INIT, then ARMED, then
// ACTIVE (Set PortInfo). Ports that stop answering are reported gone and
// their LIDs are free again (the fabric hands the slot to the next port).
#pragma once

#include "hca/base/status.h"
#include "hca/drv/verbs.h"
#include "hca/fabric/fabric.h"
#include "mad/smi_client.h"

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace mlx4x::fabric { class shm_fabric; }

namespace mlx4x::mad {

class subnet_manager {
public:
    /// A candidate for fabric `fab`; `lock_path` is the fabric's SM file.
    /// `idle` runs while the master waits for answers (tests progress
    /// the other devices of an in-process fabric there).
    static result<std::unique_ptr<subnet_manager>> create(fabric::fabric &fab,
                                                          std::string lock_path,
                                                          smi_client::idle_fn idle = {});
    ~subnet_manager();
    subnet_manager(const subnet_manager &) = delete;
    subnet_manager &operator=(const subnet_manager &) = delete;

    /// Becomes the master if no candidate is (never blocks): true when
    /// this one is the master, now or already.
    bool try_master();
    bool master() const { return smi_ != nullptr; }
    /// The master's own port's LID (MasterSMLID); 0 when not the master.
    uint16_t lid() const;

    struct sweep_report {
        std::vector<uint16_t> ports;       ///< LIDs that answered
        std::vector<uint16_t> brought_up;  ///< ... and were set up now
        std::vector<uint16_t> gone;        ///< known before, silent now
        std::vector<uint16_t> failed;      ///< refused a Set (e.g. M_Key)
        struct trap { uint16_t lid; uint16_t number; };
        std::vector<trap>     traps;       ///< received (and repressed)
    };
    /// One sweep of LIDs 1..max_lid (the master only; empty otherwise).
    sweep_report sweep(uint16_t max_lid);

private:
    subnet_manager(fabric::fabric &fab, int lock_fd, std::string lock_path,
                   smi_client::idle_fn idle)
        : fab_(fab), lock_fd_(lock_fd), lock_path_(std::move(lock_path)),
          idle_(std::move(idle)) {}
    bool lock_is_current();
    bool bring_up(uint16_t lid, const smp &port_info_resp);

    fabric::fabric               &fab_;
    int                           lock_fd_;
    std::string                   lock_path_;
    smi_client::idle_fn           idle_;
    std::unique_ptr<drv::context> ctx_;    ///< the SM node's HCA
    std::unique_ptr<smi_client>   smi_;
    std::set<uint16_t>            known_;  ///< LIDs seen by the last sweep
    std::vector<sweep_report::trap> traps_;   ///< since the last report
};

/// An SM candidate on the shm fabric `fabric_name`: a thread that tries
/// for mastership every `period` and sweeps while it is the master. A
/// process runs one per fabric (uct::fabric_node shares it among the
/// process's memory domains), so the first process of a fabric is its
/// master ("the first port up"), and when that process exits another one,
/// or a standalone mlx4x-sm, takes over.
class sm_service {
public:
    static result<std::shared_ptr<sm_service>> start(const std::string &fabric_name,
                                                     std::chrono::milliseconds period);
    ~sm_service();   // stops the thread; a master lets go of the fabric

    sm_service() = default;
    sm_service(const sm_service &) = delete;
    sm_service &operator=(const sm_service &) = delete;

private:
    void run(std::chrono::milliseconds period);

    std::unique_ptr<fabric::shm_fabric> fabric_;
    std::unique_ptr<subnet_manager>     sm_;
    std::thread                         thread_;
    std::mutex                          mu_;
    std::condition_variable             wake_;
    bool                                stop_ = false;
    std::atomic<bool>                   stopping_{false};   ///< read by the sweep's naps
};

} // namespace mlx4x::mad
