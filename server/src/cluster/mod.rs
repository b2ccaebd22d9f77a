//! Clusters of percore nodes on etcd (issue 18; docs/cluster.md): the
//! etcd client, the map's keys and transactions, and a node's control
//! thread. The placement function itself is shared with clients
//! (`percore_protocol::placement`).

pub mod catalog;
pub mod control;
pub mod etcd;
pub mod handoff;
pub mod map;
pub mod peer_http;
pub mod replicate;
pub mod shardmap;
