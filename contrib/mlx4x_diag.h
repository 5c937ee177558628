// SPDX-License-Identifier: BSD-3-Clause
// What mlx4x-stat, mlx4x-smpquery and mlx4x-netdiscover share: a port of
// their own on the fabric ($UCX_MLX4X_FABRIC or mlx4x-fabric-<uid>) with
// QP0, and the printers that format SMA answers the way infiniband-diags
// (ibstat, smpquery, ibnetdiscover) do.
#pragma once

#include "hca/drv/verbs.h"
#include "hca/fabric/shm_fabric.h"
#include "mad/smi_client.h"

#include <cstdio>
#include <map>
#include <memory>
#include <string>

namespace mlx4x::diag {

/// The tool's own HCA: a device on the shm fabric and its QP0.
class session {
public:
    /// Prints the reason and returns nullptr on failure.
    static std::unique_ptr<session> open(const char *prog);
    mad::smi_client &smi() { return *smi_; }
    uint16_t own_lid() const { return ctx_->port().lid; }
    uint16_t max_lid() const { return fabric::shm_fabric::max_lid(); }
    /// NodeInfo of every port but the tool's own, by LID.
    std::map<uint16_t, mad::smp> ports();
    ~session();

private:
    std::unique_ptr<fabric::shm_fabric> fabric_;
    std::unique_ptr<drv::context>       ctx_;
    std::unique_ptr<mad::smi_client>    smi_;
};

std::string node_description(const mad::smp &answer);

/// infiniband-diags' "Name:.......value" line, the value at column 34.
void field(FILE *out, const char *name, const std::string &value);

/// Where an answer came from, as the printers' headers name it
/// (infiniband-diags' portid2str): "Lid 5", or for a directed route
/// "DR path slid 65535; dlid 65535; 0,1".
std::string lid_address(uint16_t lid);
std::string dr_address(const std::string &route);

void print_node_info(FILE *out, const std::string &where, const mad::smp &answer);
void print_port_info(FILE *out, const std::string &where, const mad::smp &answer);
void print_node_desc(FILE *out, const mad::smp &answer);
void print_guid_info(FILE *out, const std::string &where, const mad::smp &answer);
void print_pkeys(FILE *out, const std::string &where, const mad::smp &answer);

/// The name a port's CA goes by in the tools: every mlx4x process is one
/// CA of one port, named after its LID ("mlx4x_<lid>"), which is what
/// mlx4x-smpquery takes.
std::string ca_name(uint16_t lid);
/// A PortInfo answer's active link as ibnetdiscover -p prints it: "4x QDR".
std::string active_link(const mad::smp &port_info);
/// The port GUID a NodeInfo answer carries.
uint64_t port_guid(const mad::smp &node_info);

/// ibstat's block for one CA, from its port's NodeInfo, PortInfo and
/// NodeDescription answers; with `ports`, the port's block too. The master
/// SM's own port (its LID is the SM LID it reports) is labelled.
void print_ca(FILE *out, uint16_t lid, const mad::smp &node_info,
              const mad::smp &port_info, const std::string &desc, bool ports = true);

/// "Active", "Initialize", ... as infiniband-diags spells PortState.
const char *port_state_name(uint8_t state);
const char *phys_state_name(uint8_t state);

} // namespace mlx4x::diag
