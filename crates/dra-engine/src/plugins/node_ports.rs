//! NodePorts: the host ports a pod asks for must be free on the node.

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};
use crate::state::NodeInfo;

pub struct NodePorts;

pub const REASON: &str = "node(s) didn't have free ports for the requested pod ports";

/// A host port: (protocol, ip, port).
pub type HostPort = (String, String, i32);

/// The host ports of a pod's containers and init containers.
pub fn host_ports(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|p| *p > 0)?;
            Some((
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.host_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())
                    .unwrap_or_else(|| "0.0.0.0".into()),
                port,
            ))
        })
        .collect()
}

/// Ports conflict when protocol and port match and either IP is the wildcard or both equal.
pub fn conflicts(wanted: &[HostPort], in_use: &[HostPort]) -> bool {
    wanted.iter().any(|(proto, ip, port)| {
        in_use.iter().any(|(p2, ip2, port2)| {
            proto == p2 && port == port2 && (ip == "0.0.0.0" || ip2 == "0.0.0.0" || ip == ip2)
        })
    })
}

struct PortsCycle {
    wanted: Vec<HostPort>,
}

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        "NodePorts"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(PortsCycle {
            wanted: host_ports(cycle.pod),
        })
    }
}

impl PluginCycle for PortsCycle {
    fn pre_filter(&mut self) -> Status {
        if self.wanted.is_empty() {
            Status::skip()
        } else {
            Status::success()
        }
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        if conflicts(&self.wanted, &node.ports) {
            Status::unschedulable(REASON)
        } else {
            Status::success()
        }
    }
}
