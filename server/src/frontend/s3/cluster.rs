//! The S3 door of a cluster node (`serve --cluster`; docs/cluster.md,
//! "S3 on a cluster"): any node serves any key.
//!
//! - A request about a key whose placement group another node is the
//!   primary of is forwarded to that node's S3 port, the client's signed
//!   request as it came (the owner checks the signature again), and the
//!   answer streamed back. The owner serves a forwarded request itself or,
//!   if its map disagrees, answers 503 SlowDown; it never forwards again.
//! - Bucket changes (create, delete, versioning, policy, tags, CORS,
//!   lifecycle, ACL) are sent to every node that may hold keys, this
//!   one included, so that every node holds the same buckets.
//! - ListObjects (V1, V2) merges this node's page with every other
//!   node's that may hold keys (`/_percore/list`), with the paging
//!   guarantees of a single node, and so do ListObjectVersions and
//!   ListMultipartUploads (`uploads::UploadPage`); DeleteObjects deletes
//!   each key on its owner (`/_percore/delete`).
//!
//! Node-to-node requests are authenticated with `x-percore-node`
//! (`cluster::peer_http`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use percore_protocol::placement::NodeState;
use serde_json::{json, Value};

use super::route::S3Op;
use super::uploads::UploadPage;
use super::{Conn, Request, S3Front};
use crate::bucket_config::ConfigKind;
use crate::cluster::catalog;
use crate::cluster::peer_http::{self, Claim};
use crate::cluster::replicate::{self, enc};
use crate::cluster::shardmap::{MapNode, ShardMap};
use crate::frontend::http::{BodyFraming, ResponseHead};
use crate::frontend::s3::error::S3Error;
use crate::metrics::ShardMetrics;
use crate::shard::msg::Removed;
use crate::store::versions::{version_id, Pick, VersionEntry};
use crate::store::ListItem;

/// Largest internal answer (a listing page of 1,000 keys is ~200 KB).
const INTERNAL_ANSWER_MAX: usize = 16 << 20;
/// Largest internal request body (1,000 deletes of 1 KiB keys).
const INTERNAL_BODY_MAX: usize = 2 << 20;
/// A forward sent through another node (`S3Front::forward`): that node
/// forwards it to the key's owner, once (the node MAC covers it).
use peer_http::RELAY_HEADER;

mod delete_bucket;
/// Nodes a forward tries to go through when the owner cannot be reached.
const RELAYS_TRIED: usize = 2;
/// Request headers not passed on (hop by hop, or ours).
const HOP_HEADERS: [&str; 10] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "expect",
    "proxy-connection",
    "trailer",
    peer_http::HEADER,
    RELAY_HEADER,
];
/// Response headers this node writes itself.
const OWN_RESPONSE_HEADERS: [&str; 6] = [
    "date",
    "server",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
];

/// A key of DeleteObjects another node owns: (index in the request, key,
/// version).
pub(super) type RemoteDelete = (usize, String, Option<String>);

/// A node a request goes to.
#[derive(Debug, Clone)]
pub(super) struct Peer {
    pub id: u32,
    pub name: String,
    pub addr: SocketAddr,
}

/// What a cluster node does with a request.
pub(super) enum Plan {
    /// Serve it here (a single node, or this node owns the key).
    Here,
    /// Forward it to the key's owner.
    Forward(Peer),
}

/// How long after a forward's connect to a node timed out this shard
/// gives it only `RECONNECT_TIMEOUT` to connect. Renewed only by another
/// whole `peer_http::CONNECT_TIMEOUT` that ran out: a node cut off costs
/// one forward per shard that long, at most every this often.
const UNREACHABLE_KEPT: Duration = Duration::from_secs(30);
/// The connect a node whose connect timed out lately gets before the
/// forward goes through a relay: time for a SYN sent again (after 1 s)
/// to a node that dropped the first (a full accept queue), far less than
/// the whole `peer_http::CONNECT_TIMEOUT` every forward would otherwise
/// wait while a cut drops packets (the same time a request on a kept
/// connection gets to be acknowledged).
const RECONNECT_TIMEOUT: Duration = peer_http::KEPT_ACK_TIMEOUT;

thread_local! {
    /// Per shard: the nodes its forwards' connects timed out on, and when
    /// the last whole connect timeout ran out.
    static UNREACHABLE: std::cell::RefCell<std::collections::HashMap<u32, Instant>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Whether a forward of this shard timed out connecting to `node` within
/// `UNREACHABLE_KEPT`.
fn unreachable_lately(node: u32) -> bool {
    UNREACHABLE.with(|u| {
        u.borrow()
            .get(&node)
            .is_some_and(|t| t.elapsed() < UNREACHABLE_KEPT)
    })
}

/// Opens a forward's connection to `node` at `addr`: with the whole
/// connect timeout, or `RECONNECT_TIMEOUT` if `remember` and its connect
/// timed out lately. A connect that works forgets that; a whole timeout
/// that runs out remembers it (a refusal, or a short connect that fails,
/// neither).
async fn open_to(node: u32, addr: SocketAddr, remember: bool) -> std::io::Result<TcpStream> {
    let short = remember && unreachable_lately(node);
    let timeout = if short {
        RECONNECT_TIMEOUT
    } else {
        peer_http::CONNECT_TIMEOUT
    };
    let opened = peer_http::open_within(addr, timeout).await;
    UNREACHABLE.with(|u| {
        let mut u = u.borrow_mut();
        match &opened {
            Ok(_) => {
                u.remove(&node);
            }
            Err(e) if !short && e.kind() == std::io::ErrorKind::TimedOut => {
                // Bounded by the map's node count (stale entries go first).
                u.retain(|_, t| t.elapsed() < UNREACHABLE_KEPT);
                u.insert(node, Instant::now());
            }
            Err(_) => {}
        }
    });
    opened
}

fn unavailable(message: impl Into<String>) -> S3Error {
    S3Error::new(503, "ServiceUnavailable", message)
}

fn slow_down(message: impl Into<String>) -> S3Error {
    S3Error::new(503, "SlowDown", message)
}

/// 503 unless this node's copy of the catalog is known current
/// (`catalog::serving`): a listing's part or a delete by a peer's request
/// goes by its bucket as the catalog has it.
fn catalog_check() -> Result<(), S3Error> {
    if catalog::serving() {
        Ok(())
    } else {
        Err(unavailable(
            "this node cannot confirm the cluster's buckets with etcd right now",
        ))
    }
}

/// Refuses (503) what only the acting primary of group `pg` (`None`:
/// of every group this node leads) may serve, its data or its part of a
/// listing, while this node may not lead it (`control::may_lead`: its
/// lease or map is not confirmed, or it is taking the group over).
pub(super) fn lead_check(map: &ShardMap, pg: Option<u32>) -> Result<(), S3Error> {
    crate::cluster::control::may_lead(map, pg).map_err(unavailable)
}

pub(super) fn peer_of(n: &MapNode) -> Result<Peer, S3Error> {
    let addr = n.s3.ok_or_else(|| {
        unavailable(format!(
            "cluster node {} has no usable S3 address in the map",
            n.name
        ))
    })?;
    Ok(Peer {
        id: n.id,
        name: n.name.clone(),
        addr,
    })
}

/// The other nodes a listing asks for their parts: 503 if a placement
/// group has no replica up (its keys would be missing) or this node may
/// not lead its own part now.
fn listing_peers(map: &ShardMap) -> Result<Vec<Peer>, S3Error> {
    if !map.all_groups_served() {
        return Err(unavailable(
            "Some placement groups have no replica up: a listing would miss their keys; retry when nodes return.",
        ));
    }
    let peers = map.listing_peers().map(peer_of).collect::<Result<_, _>>()?;
    lead_check(map, None)?;
    Ok(peers)
}

/// The answer to a bucket change that etcd decided.
fn outcome_result(outcome: catalog::Outcome) -> Result<(), S3Error> {
    match outcome {
        catalog::Outcome::Missing => Err(S3Error::no_such_bucket()),
        catalog::Outcome::Conflict => Err(S3Error::new(
            409,
            "OperationAborted",
            "The bucket was deleted and made again by another owner while this request was on its way; retry.",
        )),
        _ => Ok(()),
    }
}

/// The static code of an error a peer reported (unknown ones are
/// internal errors).
pub(super) fn static_code(code: &str) -> &'static str {
    const KNOWN: [&str; 11] = [
        "AccessDenied",
        "InvalidRequest",
        "NoSuchKey",
        "NoSuchBucket",
        "NoSuchVersion",
        "InvalidArgument",
        "MethodNotAllowed",
        "ServiceUnavailable",
        "SlowDown",
        "InsufficientStorage",
        "InternalError",
    ];
    KNOWN
        .into_iter()
        .find(|k| *k == code)
        .unwrap_or("InternalError")
}

impl S3Front {
    /// The cluster map, on a cluster node that has one.
    pub(super) fn map(&self) -> Result<Option<std::sync::Arc<ShardMap>>, S3Error> {
        if !self.shard.is_cluster() {
            return Ok(None);
        }
        self.shard.cluster_map().map(Some).ok_or_else(|| {
            unavailable("This cluster node has not read the cluster map yet; retry shortly.")
        })
    }

    pub(super) fn cluster_key(&self) -> [u8; 32] {
        peer_http::cluster_key(&self.cfg.credentials.secret_key)
    }

    /// A bucket change on a cluster node: recorded in etcd and applied on
    /// every node that is up (`catalog::change`; 503 if that failed).
    /// None on a single node: the caller changes its shards.
    pub(super) async fn cluster_bucket_change(
        &self,
        change: catalog::Change,
    ) -> Result<Option<catalog::Outcome>, S3Error> {
        if !self.shard.is_cluster() {
            return Ok(None);
        }
        ShardMetrics::add(&self.shard.metrics().cluster_fanned_out, 1);
        catalog::change(&self.shard, &self.cluster_key(), change)
            .await
            .map(Some)
            .map_err(unavailable)
    }

    /// Stores (Some) or removes (None) a bucket's `kind` document: in the
    /// cluster's catalog on a cluster node, else on the shards. `owner`:
    /// the bucket's owner when the request was authorized
    /// (`authorized_owner`, taken before the handler's first wait).
    pub(super) async fn set_bucket_doc(
        &self,
        (bucket, owner): (&str, Option<String>),
        kind: ConfigKind,
        doc: Option<bytes::Bytes>,
    ) -> Result<(), S3Error> {
        if self.shard.is_cluster()
            && doc
                .as_ref()
                .is_some_and(|d| d.len() > crate::store::bucket_config::CONFIG_DOC_BYTES_MAX)
        {
            // Every node must be able to store what etcd takes.
            return Err(S3Error::invalid_argument(format!(
                "a bucket configuration document is at most {} bytes as stored",
                crate::store::bucket_config::CONFIG_DOC_BYTES_MAX
            )));
        }
        let change = catalog::Change::Doc {
            name: bucket.to_string(),
            kind,
            doc: doc.clone(),
            owner,
        };
        match self.cluster_bucket_change(change).await? {
            None => Ok(self.shard.set_bucket_config(bucket, kind, doc).await?),
            Some(outcome) => outcome_result(outcome),
        }
    }

    /// The owner of `bucket` in this node's view, which the request was
    /// authorized against when taken before any wait (None: the root
    /// principal).
    pub(super) fn authorized_owner(&self, bucket: &str) -> Option<String> {
        self.shard
            .bucket_config(bucket)
            .and_then(|c| c.owner.as_deref().map(str::to_string))
    }

    /// A node-authenticated POST of `body` to `target` on `peer` (one of
    /// the shard's open peer calls): its status and answer (at most `max`
    /// bytes).
    async fn peer_post(
        &self,
        map: &ShardMap,
        peer: &Peer,
        target: &str,
        body: &[u8],
        max: usize,
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let _permit = self.peer_calls.acquire_permit(1).await;
        let mac = self.sign(map, peer.id, "POST", target, &peer_http::body_hash(body));
        peer_http::call(
            &self.cluster_key(),
            peer.addr,
            "POST",
            target,
            &mac,
            body,
            max,
        )
        .await
    }

    /// The node header for a request from this node to `to`.
    pub(super) fn sign(
        &self,
        map: &ShardMap,
        to: u32,
        method: &str,
        target: &str,
        body: &str,
    ) -> String {
        replicate::sign(&self.cluster_key(), map, to, method, target, body)
    }

    /// The `x-percore-node` claim of a request another node sent (None:
    /// a client's, or a single node, which ignores the header). A header
    /// that does not verify is refused; with the built-in default keys
    /// (which anyone can sign with) only from loopback peers.
    pub(super) fn node_claim(
        &self,
        req: &Request,
        loopback: bool,
    ) -> Result<Option<Claim>, S3Error> {
        if !self.shard.is_cluster() {
            return Ok(None);
        }
        let Some(v) = req.head.header_str(peer_http::HEADER) else {
            return Ok(None);
        };
        let m = self.shard.metrics();
        let refuse = |why: String| {
            ShardMetrics::add(&m.cluster_node_refused, 1);
            S3Error::new(403, "AccessDenied", format!("Bad node header: {why}"))
        };
        if !self.cfg.credentials.allowed_from(loopback) {
            return Err(refuse(
                "nodes started with the default keys take node-to-node requests from loopback only; start every node with the same PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY".into(),
            ));
        }
        let map = self.map()?.expect("a cluster node");
        let claim = peer_http::verify(
            &self.cluster_key(),
            v,
            map.node_id,
            &req.head.method,
            &req.head.target,
            req.head.header_str(RELAY_HEADER),
        )
        .map_err(refuse)?;
        if map.node(claim.from).is_none() {
            // A node that just joined, before this one read the map.
            return Err(slow_down(format!(
                "node {} is not in this node's cluster map yet; retry",
                claim.from
            )));
        }
        ShardMetrics::add(&m.cluster_node_requests, 1);
        Ok(Some(claim))
    }

    /// Whether this node serves `key` (always, on a single node).
    pub(super) fn owns_key(&self, bucket: &str, key: &str) -> bool {
        match self.shard.cluster_map() {
            Some(map) if self.shard.is_cluster() => map.primary_of(bucket, key) == map.node_id,
            _ => true,
        }
    }

    /// Where a cluster node sends `req` (after it authenticated it).
    pub(super) fn plan(&self, req: &Request, claim: Option<&Claim>) -> Result<Plan, S3Error> {
        let Some(map) = self.map()? else {
            return Ok(Plan::Here);
        };
        if req.op == S3Op::BatchGet {
            return Err(S3Error::not_implemented(
                "the S3 batch read on a cluster (GET each key, or use the native client's get_batch)",
            ));
        }
        if req.key.is_empty() {
            if matches!(
                req.op,
                S3Op::DeleteObjects
                    | S3Op::ListObjects
                    | S3Op::ListObjectsV2
                    | S3Op::ListObjectVersions
            ) {
                lead_check(&map, None)?;
            }
            return Ok(Plan::Here);
        }
        let primary = map.primary_of(&req.bucket, &req.key);
        if primary == map.node_id {
            lead_check(&map, Some(map.pg_of(&req.bucket, &req.key)))?;
            return Ok(Plan::Here);
        }
        let node = map.node(primary).ok_or_else(|| {
            unavailable("No node holds this key's placement group (are any nodes up?).")
        })?;
        if let Some(c) = claim {
            // A door that cannot reach the owner sent it through this node
            // (`forward`): passed on once, never back to the sender.
            if c.relay.is_some() && c.from != primary {
                return Ok(Plan::Forward(peer_of(node)?));
            }
            return Err(slow_down("The cluster map is changing (the nodes disagree on this key's owner for a moment); retry."));
        }
        Ok(Plan::Forward(peer_of(node)?))
    }

    /// The request head as node `to` gets it: the client's own, minus the
    /// hop-by-hop fields, plus the node header (and the relay header for
    /// a relay), and `Connection: close` unless `keep`.
    fn peer_head(
        &self,
        req: &Request,
        to: u32,
        content_length: Option<u64>,
        relay: Option<u32>,
        keep: bool,
    ) -> Vec<u8> {
        let mut h = Vec::with_capacity(1024);
        h.extend_from_slice(
            format!("{} {} HTTP/1.1\r\n", req.head.method, req.head.target).as_bytes(),
        );
        for (name, value) in &req.head.headers {
            if HOP_HEADERS.contains(&name.as_str())
                || (content_length.is_some() && name == "content-length")
            {
                continue;
            }
            h.extend_from_slice(name.as_bytes());
            h.extend_from_slice(b": ");
            h.extend_from_slice(value);
            h.extend_from_slice(b"\r\n");
        }
        match content_length {
            Some(n) => h.extend_from_slice(format!("content-length: {n}\r\n").as_bytes()),
            None if req.head.body_framing().ok() == Some(BodyFraming::Chunked) => {
                h.extend_from_slice(b"transfer-encoding: chunked\r\n");
            }
            None => {}
        }
        // "-": the client's own signature covers the body.
        let mac = self.shard.cluster_map().map_or_else(String::new, |m| {
            peer_http::sign(
                &self.cluster_key(),
                &peer_http::Signed {
                    from: m.node_id,
                    to,
                    method: &req.head.method,
                    target: &req.head.target,
                    body: "-",
                    relay,
                },
            )
        });
        if !keep {
            h.extend_from_slice(b"connection: close\r\n");
        }
        h.extend_from_slice(format!("{}: {mac}\r\n", peer_http::HEADER).as_bytes());
        if let Some(owner) = relay {
            h.extend_from_slice(format!("{RELAY_HEADER}: {owner}\r\n").as_bytes());
        }
        h.extend_from_slice(b"\r\n");
        h
    }

    /// Forwards `req` to its owner and streams the answer back.
    pub(super) async fn forward(
        &self,
        conn: &mut Conn,
        req: &Request,
        peer: Peer,
    ) -> Result<(), S3Error> {
        // No peer-call permit: a forward lasts as long as its client's
        // transfer, and slow clients must not starve listings and fan-outs
        // (the connection limits bound forwards).
        ShardMetrics::add(&self.shard.metrics().cluster_forwarded, 1);
        let addr = peer.addr;
        let unreachable = |e: std::io::Error| {
            unavailable(format!(
                "The cluster node that owns this key ({} at {addr}) cannot be reached: {e}",
                peer.name
            ))
        };
        // An owner this shard's connects timed out on lately is given a
        // short connect before the relay, not the whole timeout again; a
        // relay passing a request on (the last hop) gives it the whole.
        // (A relay header counts only with a node header, which verified
        // and covers it: `node_claim`.)
        let relayed = req.head.header_str(RELAY_HEADER).is_some()
            && req.head.header_str(peer_http::HEADER).is_some();
        // A GET or HEAD without a body goes on a connection kept from an
        // earlier one to the owner where this shard has one, and its
        // connection is kept after (reads are most of the forwards).
        let keep = matches!(req.head.method.as_str(), "GET" | "HEAD")
            && req.head.body_framing().ok() == Some(BodyFraming::Empty);
        if keep {
            if let Some(done) = self.forward_kept(conn, req, &peer).await {
                return done;
            }
        }
        let (mut stream, head, keep) = match open_to(peer.id, addr, !relayed).await {
            Ok(s) => (s, self.peer_head(req, peer.id, None, None, keep), keep),
            // Cut off from the owner (a forward that came through another
            // node is not sent on again): through a node that may reach it
            // (a connection to the relay, which closes it: never kept).
            Err(e) if !relayed => {
                let (s, head) = self
                    .open_relay(req, &peer)
                    .await
                    .ok_or_else(|| unreachable(e))?;
                (s, head, false)
            }
            Err(e) => return Err(unreachable(e)),
        };
        stream.write_all(&head).await.map_err(unreachable)?;
        if req.head.expects_continue() {
            conn.send_continue().await?;
        }
        let mut buf = vec![0u8; 64 * 1024];
        // A write error may mean the owner answered early (a refusal) and
        // closed: its answer is read all the same.
        let sent = pass_body(conn, &mut stream, &mut buf, req).await?;
        let resp = match peer_http::read_response(stream).await {
            Ok(r) => r,
            Err(e) => return Err(unreachable(sent.err().unwrap_or(e))),
        };
        let kept = self.relay(conn, req, resp, &mut buf, keep).await?;
        if let Some(s) = kept.filter(|_| keep) {
            peer_http::pool_put(addr, s);
        }
        Ok(())
    }

    /// `forward` of a GET or HEAD without a body on a connection this
    /// shard kept to the owner (`peer_http::pool_take`): None if it has
    /// none, or if the owner closed it before answering (sent again on a
    /// new connection by the caller: nothing reached the client yet).
    async fn forward_kept(
        &self,
        conn: &mut Conn,
        req: &Request,
        peer: &Peer,
    ) -> Option<Result<(), S3Error>> {
        let mut stream = peer_http::pool_take(peer.addr)?;
        ShardMetrics::add(&self.shard.metrics().cluster_kept_connections_used, 1);
        let head = self.peer_head(req, peer.id, None, None, true);
        if stream.write_all(&head).await.is_err() || stream.flush().await.is_err() {
            peer_http::pool_forget(peer.addr);
            return None;
        }
        // Not acknowledged in time (the owner cut off since): on a new
        // connection, whose connect fails or is relayed.
        let Ok(resp) = peer_http::read_response_acked(stream).await else {
            peer_http::pool_forget(peer.addr);
            return None;
        };
        // An owner that is stopping answers 503 on kept connections (and
        // closes): sent again on a new connection, or through a relay.
        if resp.status == 503 && resp.closes() {
            peer_http::pool_forget(peer.addr);
            return None;
        }
        let mut buf = vec![0u8; 64 * 1024];
        Some(match self.relay(conn, req, resp, &mut buf, true).await {
            Ok(kept) => {
                if let Some(s) = kept {
                    peer_http::pool_put(peer.addr, s);
                }
                Ok(())
            }
            Err(e) => Err(e),
        })
    }

    /// A connection to another synced up node (at most `RELAYS_TRIED`,
    /// starting at one picked at random), with the head of `req` sent
    /// through it to `owner`; None if none can be reached. The node header
    /// names the relay; the relay header asks it to pass the request on.
    async fn open_relay(&self, req: &Request, owner: &Peer) -> Option<(TcpStream, Vec<u8>)> {
        let map = self.shard.cluster_map()?;
        let relays: Vec<&MapNode> = map
            .nodes
            .iter()
            .filter(|n| {
                n.id != map.node_id && n.id != owner.id && n.synced && n.state == NodeState::Up
            })
            .collect();
        if relays.is_empty() {
            return None;
        }
        // From one picked at random; those whose connects did not time out
        // lately first.
        let first = rand::random::<usize>() % relays.len();
        let mut relays: Vec<&MapNode> = relays
            .iter()
            .cycle()
            .skip(first)
            .take(relays.len())
            .copied()
            .collect();
        relays.sort_by_key(|n| unreachable_lately(n.id));
        for n in relays.iter().take(RELAYS_TRIED) {
            let Some(addr) = n.s3 else {
                continue;
            };
            if let Ok(s) = open_to(n.id, addr, true).await {
                let head = self.peer_head(req, n.id, None, Some(owner.id), false);
                ShardMetrics::add(&self.shard.metrics().cluster_relayed, 1);
                return Some((s, head));
            }
        }
        None
    }

    /// Writes a peer's answer to the client; returns the connection to
    /// the peer if the answer was read to its end and the peer keeps it
    /// open (`peer_http::Response::into_reusable`). `kept`: the request
    /// did not ask the peer to close, so an answer whose end is the
    /// peer's close (chunked, or without a length) cannot be relayed (no
    /// answer to a GET or HEAD is, today).
    async fn relay(
        &self,
        conn: &mut Conn,
        req: &Request,
        mut resp: peer_http::Response,
        buf: &mut [u8],
        kept: bool,
    ) -> Result<Option<TcpStream>, S3Error> {
        let mut head = ResponseHead::new(resp.status);
        for (n, v) in &resp.headers {
            if OWN_RESPONSE_HEADERS.contains(&n.as_str()) || n.starts_with("access-control-") {
                continue;
            }
            head.push_header(n.clone(), v.clone());
        }
        // The owner refused before the client's body was all read: the
        // connection closes after the answer.
        let close = !conn.body_finished();
        let bodiless =
            req.head.method == "HEAD" || matches!(resp.status, 204 | 304) || resp.status < 200;
        if bodiless {
            conn.write_response(&head, resp.content_length().unwrap_or(0), close)
                .await?;
            conn.flush().await?;
            // A 1xx is not the end of the owner's answer.
            return Ok(if resp.status >= 200 {
                resp.into_reusable()
            } else {
                None
            });
        }
        if kept && (resp.is_chunked() || resp.content_length().is_none()) {
            return Err(unavailable(
                "the owner node answered a kept request without a length; retry",
            ));
        }
        if resp.is_chunked() {
            if !conn.request_is_http11() {
                return Err(unavailable(
                    "the owner node answered in chunks, which an HTTP/1.0 client cannot read",
                ));
            }
            // Passed on as it came (still chunk-encoded) to the owner's
            // close; then this connection closes too (the error below is
            // not written: the head is out), so a body the owner cut short
            // is never taken for a whole one.
            conn.write_response_chunked(&head).await?;
            loop {
                let n = resp
                    .read(buf)
                    .await
                    .map_err(|e| S3Error::internal(e.to_string()))?;
                if n == 0 {
                    conn.flush().await?;
                    return Err(S3Error::internal("a chunked relay ends its connection"));
                }
                conn.write_body(&buf[..n]).await?;
            }
        }
        let Some(len) = resp.content_length() else {
            let body = resp
                .body(INTERNAL_ANSWER_MAX)
                .await
                .map_err(|e| unavailable(format!("the owner node's answer failed: {e}")))?;
            conn.write_response(&head, body.len() as u64, close).await?;
            conn.write_body(&body).await?;
            conn.flush().await?;
            // Read to the owner's close: nothing to keep.
            return Ok(None);
        };
        conn.write_response(&head, len, close).await?;
        let mut left = len;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = resp
                .read(&mut buf[..want])
                .await
                .map_err(|e| S3Error::internal(e.to_string()))?;
            if n == 0 {
                // The head is out: closing tells the client the body is short.
                return Err(S3Error::internal("the owner node closed mid-answer"));
            }
            conn.write_body(&buf[..n]).await?;
            left -= n as u64;
        }
        conn.flush().await?;
        Ok(resp.into_reusable())
    }

    /// One internal GET listing of `peer`'s own keys.
    async fn peer_list(
        &self,
        map: &ShardMap,
        peer: &Peer,
        target: &str,
    ) -> Result<(Vec<ListItem>, bool), S3Error> {
        let (status, body) = self.peer_get(map, peer, target).await?;
        parse_list_answer(status, &body)
            .map_err(|e| unavailable(format!("cluster node {}: {e}; retry", peer.name)))
    }

    /// One internal GET listing of `peer`'s own uploads.
    async fn peer_uploads(
        &self,
        map: &ShardMap,
        peer: &Peer,
        target: &str,
    ) -> Result<UploadPage, S3Error> {
        let (status, body) = self.peer_get(map, peer, target).await?;
        let page = if status == 200 {
            UploadPage::from_json(&body)
        } else {
            Err(format!(
                "listing answered {status}: {}",
                String::from_utf8_lossy(&body)
            ))
        };
        page.map_err(|e| unavailable(format!("cluster node {}: {e}; retry", peer.name)))
    }

    /// One internal GET of a listing's part: the answer's status and body.
    pub(super) async fn peer_get(
        &self,
        map: &ShardMap,
        peer: &Peer,
        target: &str,
    ) -> Result<(u16, Vec<u8>), S3Error> {
        let _permit = self.peer_calls.acquire_permit(1).await;
        let mac = self.sign(map, peer.id, "GET", target, &peer_http::body_hash(b""));
        peer_http::call(
            &self.cluster_key(),
            peer.addr,
            "GET",
            target,
            &mac,
            b"",
            INTERNAL_ANSWER_MAX,
        )
        .await
        .map_err(|e| {
            unavailable(format!(
                "cluster node {} cannot be reached for the listing: {e}; retry",
                peer.name
            ))
        })
    }

    /// ListObjects on a cluster: this node's items merged with every other
    /// node's that may hold keys (one that cannot be reached fails the
    /// listing: a partial one would look complete).
    pub(super) async fn list_cluster(
        &self,
        local: (Vec<ListItem>, bool),
        bucket: &str,
        prefix: &str,
        from: &str,
        delimiter: Option<&str>,
        max: usize,
    ) -> Result<(Vec<ListItem>, bool), S3Error> {
        self.list_cluster_of(local, (bucket, prefix, from, delimiter), max, None)
            .await
    }

    /// `list_cluster`; with `versions` (the version to resume after within
    /// `from`, if any) a listing of versions: each key's versions come from
    /// the node that leads it.
    pub(super) async fn list_cluster_of(
        &self,
        local: (Vec<ListItem>, bool),
        (bucket, prefix, from, delimiter): (&str, &str, &str, Option<&str>),
        max: usize,
        versions: Option<Option<Pick>>,
    ) -> Result<(Vec<ListItem>, bool), S3Error> {
        let Some(map) = self.map()? else {
            return Ok(local);
        };
        let local = if versions.is_some() {
            versions_page(local, max)
        } else {
            local
        };
        let mut target = format!(
            "/_percore/list?bucket={}&prefix={}&from={}&delimiter={}&max={max}",
            enc(bucket),
            enc(prefix),
            enc(from),
            enc(delimiter.unwrap_or(""))
        );
        if let Some(resume) = versions {
            target.push_str("&versions=1");
            match resume {
                Some(Pick::Id(id)) => target.push_str(&format!("&vmark={}", version_id(Some(id)))),
                Some(Pick::Null) => target.push_str("&vmark=null"),
                Some(Pick::Current) | None => {}
            }
        }
        let peers = listing_peers(&map)?;
        let calls = peers.iter().map(|peer| self.peer_list(&map, peer, &target));
        let mut pages = vec![(own_items(&map, bucket, local.0), local.1)];
        for got in futures::future::join_all(calls).await {
            pages.push(got?);
        }
        Ok(merge_listings(pages, max))
    }

    /// ListMultipartUploads on a cluster: the uploads this node serves
    /// (of `local`, its own page) merged with every other node's that may
    /// hold keys (`/_percore/list?uploads=1`), as `list_cluster` merges
    /// keys (`UploadPage`). An upload a node holds for a key it does not
    /// lead (left from before a placement change) is not listed: no door
    /// reaches it.
    pub(super) async fn uploads_cluster(
        &self,
        (bucket, prefix, key_marker, id_marker): (&str, &str, &str, &str),
        max: usize,
    ) -> Result<UploadPage, S3Error> {
        let Some(map) = self.map()? else {
            return Ok(self
                .node_uploads(bucket, prefix, (key_marker, id_marker), max)
                .await?);
        };
        let target = format!(
            "/_percore/list?uploads=1&bucket={}&prefix={}&from={}&umark={}&max={max}",
            enc(bucket),
            enc(prefix),
            enc(key_marker),
            enc(id_marker)
        );
        let peers = listing_peers(&map)?;
        let calls = peers.iter().map(|peer| async {
            let page = self.peer_uploads(&map, peer, &target).await?;
            page.check(prefix, (key_marker, id_marker), max)
                .map_err(|e| unavailable(format!("cluster node {}: {e}; retry", peer.name)))
        });
        let local = super::uploads::served_page(
            |k, id| async move { self.node_uploads(bucket, prefix, (&k, &id), max).await },
            (key_marker, id_marker),
            |k| map.primary_of(bucket, k) == map.node_id,
            max,
        )
        .await?;
        let mut pages = vec![local];
        for got in futures::future::join_all(calls).await {
            pages.push(got?);
        }
        Ok(UploadPage::merge(pages))
    }

    /// Deletes `keys` (index, key, version) on the nodes that own them;
    /// the results by index. Keys this node owns are not among them.
    pub(super) async fn delete_remote(
        &self,
        bucket: &str,
        keys: Vec<RemoteDelete>,
    ) -> Result<Vec<(usize, Result<Removed, S3Error>)>, S3Error> {
        let Some(map) = self.map()? else {
            return Ok(Vec::new());
        };
        let mut groups: std::collections::BTreeMap<u32, Vec<RemoteDelete>> =
            std::collections::BTreeMap::new();
        for k in keys {
            groups
                .entry(map.primary_of(bucket, &k.1))
                .or_default()
                .push(k);
        }
        // At most 250 keys per request (within INTERNAL_BODY_MAX whatever
        // the keys' escaping).
        let groups: Vec<(u32, Vec<RemoteDelete>)> = groups
            .into_iter()
            .flat_map(|(node, items)| {
                items
                    .chunks(250)
                    .map(|c| (node, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let enc = percent_encoding::utf8_percent_encode(bucket, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
        let target = format!("/_percore/delete?bucket={enc}");
        let calls = groups.into_iter().map(|(node, items)| {
            let (target, map) = (&target, &map);
            async move {
                let fail = |e: S3Error| {
                    items
                        .iter()
                        .map(|(i, _, _)| (*i, Err(e.clone())))
                        .collect::<Vec<_>>()
                };
                let Some(peer) = map.node(node).and_then(|n| peer_of(n).ok()) else {
                    return fail(unavailable("the node that owns this key is not in the map"));
                };
                let body = Value::Array(
                    items
                        .iter()
                        .map(|(_, k, v)| json!({"k": k, "v": v}))
                        .collect(),
                )
                .to_string();
                let got = self
                    .peer_post(map, &peer, target, body.as_bytes(), INTERNAL_ANSWER_MAX)
                    .await;
                let answers = match got {
                    Ok((200, b)) => serde_json::from_slice::<Vec<Value>>(&b).ok(),
                    _ => None,
                };
                match answers {
                    Some(a) if a.len() == items.len() => items
                        .iter()
                        .zip(a)
                        .map(|((i, _, _), v)| (*i, removed_of(&v)))
                        .collect(),
                    _ => fail(unavailable(format!(
                        "the cluster node that owns this key ({}) did not answer the delete; retry",
                        peer.name
                    ))),
                }
            }
        });
        Ok(futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect())
    }

    /// `/_percore/...`: requests from other nodes, authenticated by their
    /// MAC alone (which must name the body's hash and is taken once).
    /// Answers JSON; the connection closes after.
    // One dispatch over the internal requests (authentication first).
    #[allow(clippy::too_many_lines)]
    pub(super) async fn internal(
        &self,
        conn: &mut Conn,
        req: &Request,
        loopback: bool,
    ) -> Result<(), S3Error> {
        let denied = |why: &str| S3Error::new(403, "AccessDenied", why.to_string());
        let claim = self
            .node_claim(req, loopback)?
            .ok_or_else(|| denied("Internal requests come from cluster nodes."))?;
        if claim.body == "-" {
            return Err(denied("An internal request names its body's hash."));
        }
        let q = |name: &str| req.q(name).unwrap_or("").to_string();
        // A copy's MAC covers its state header; its bytes are checked
        // against the state's MD5 as they are stored.
        let push = req.head.method == "PUT" && req.head.path == "/_percore/push";
        let pushed = if push {
            let (json, state) = replicate::KeyState::decode(
                req.head
                    .header_str(replicate::STATE_HEADER)
                    .unwrap_or_default(),
            )
            .map_err(S3Error::invalid_argument)?;
            if peer_http::body_hash(&json) != claim.body {
                return Err(denied("The state does not match the node header."));
            }
            Some(state)
        } else {
            None
        };
        let body = match req.head.method.as_str() {
            "POST" => self.read_small_body(conn, req, INTERNAL_BODY_MAX).await?,
            _ => Vec::new(),
        };
        if !push && peer_http::body_hash(&body) != claim.body {
            return Err(denied("The body does not match the node header."));
        }
        if !peer_http::internal_time_ok(claim.ms) {
            return Err(denied("An internal request's time is more than 30 s from this node's clock (are the nodes' clocks synchronized?)."));
        }
        match self.shard.take_node_mac(claim.mac).await {
            peer_http::Take::Fresh => {}
            peer_http::Take::Seen => {
                return Err(denied("This node header was used already (a replay?)."))
            }
            peer_http::Take::Full => {
                return Err(slow_down(
                    "This node is taking more internal requests than it can remember; retry.",
                ))
            }
        }
        let map = self.map()?.expect("a cluster node");
        if let Some(state) = pushed {
            return self
                .receive_push(conn, req, &map, (claim.from, &claim.mac), state)
                .await;
        }
        let source = (req.head.method == "GET" && req.head.path == "/_percore/fetch")
            || (req.head.method == "POST" && req.head.path == "/_percore/digest");
        if source && !catalog::may_source() {
            return Err(slow_down(
                "This node has not applied the cluster's buckets since it started, or is dropping a deleted bucket's keys; retry.",
            ));
        }
        if req.head.method == "GET" && req.head.path == "/_percore/object" {
            catalog_check()?;
            return self.answer_object(conn, &map, &q, &claim.mac).await;
        }
        if req.head.method == "GET" && req.head.path == "/_percore/fetch" {
            return self
                .answer_fetch(
                    conn,
                    &map,
                    (&q("bucket"), &q("key")),
                    super::replica::mirror_epoch(req)?,
                    &claim.mac,
                )
                .await;
        }
        let answer = match (req.head.method.as_str(), req.head.path.as_str()) {
            ("POST", "/_percore/digest") => replicate::answer_digest(&self.shard, &map, &body)
                .await
                .map_err(S3Error::invalid_argument)?,
            ("POST", "/_percore/catalog") => {
                catalog::answer_sync(&map, &body).await.map_err(|e| {
                    if e.starts_with("bad catalog request") {
                        S3Error::invalid_argument(e)
                    } else {
                        unavailable(e)
                    }
                })?
            }
            ("POST", "/_percore/close") => self.answer_close(&map, &body).await?,
            ("POST", "/_percore/release") => {
                replicate::answer_release(&map, &body)
                    .await
                    .map_err(|e| match e {
                        replicate::ReleaseRefused::Bad(m) => S3Error::invalid_argument(m),
                        replicate::ReleaseRefused::Busy(m) => slow_down(m),
                    })?
            }
            ("GET", "/_percore/list") => {
                lead_check(&map, None)?;
                catalog_check()?;
                let max: usize = q("max")
                    .parse()
                    .map_err(|_| S3Error::invalid_argument("bad max"))?;
                if q("uploads") == "1" {
                    // The uploads of keys this node leads.
                    let (bucket, max) = (
                        q("bucket"),
                        max.clamp(1, super::multipart::LIST_UPLOADS_MAX),
                    );
                    let from = q("from");
                    let umark = if from.is_empty() {
                        String::new()
                    } else {
                        q("umark")
                    };
                    let prefix = q("prefix");
                    let (b, p) = (bucket.as_str(), prefix.as_str());
                    let page = match super::uploads::served_page(
                        |k, id| async move { self.node_uploads(b, p, (&k, &id), max).await },
                        (&from, &umark),
                        |k| map.primary_of(&bucket, k) == map.node_id,
                        max,
                    )
                    .await
                    {
                        Ok(page) => page,
                        Err(crate::shard::msg::ShardError::NoSuchBucket) => UploadPage::default(),
                        Err(e) => return Err(e.into()),
                    };
                    return self
                        .answer_signed(conn, &claim.mac, &page.to_json().to_string(), true)
                        .await;
                }
                let delimiter = Some(q("delimiter")).filter(|d| !d.is_empty());
                // versions=1: every version and delete marker counts
                // (vmark: the version to resume after within `from`).
                let vmark = match q("vmark").as_str() {
                    "" => None,
                    v => {
                        Some(Pick::parse(v).ok_or_else(|| S3Error::invalid_argument("bad vmark"))?)
                    }
                };
                let versions = (q("versions") == "1").then_some(vmark);
                let bucket = q("bucket");
                let got = self
                    .shard
                    .list_merged(
                        &bucket,
                        &q("prefix"),
                        &q("from"),
                        delimiter,
                        max.clamp(1, 10_000),
                        versions,
                    )
                    .await;
                let max = max.clamp(1, 10_000);
                match got.map(|page| {
                    if versions.is_some() {
                        versions_page(page, max)
                    } else {
                        page
                    }
                }) {
                    Ok((items, truncated)) => {
                        list_answer(&own_items(&map, &bucket, items), truncated)
                    }
                    Err(crate::shard::msg::ShardError::NoSuchBucket) => list_answer(&[], false),
                    Err(e) => return Err(e.into()),
                }
            }
            ("POST", "/_percore/delete") => {
                let items: Vec<Value> = serde_json::from_slice(&body)
                    .map_err(|e| S3Error::invalid_argument(format!("bad delete list: {e}")))?;
                if items.len() > 1000 {
                    return Err(S3Error::invalid_argument("more than 1000 deletes"));
                }
                lead_check(&map, None)?;
                // By the bucket's versioning as the catalog has it.
                catalog_check()?;
                self.delete_owned(&map, &q("bucket"), &items).await
            }
            _ => return Err(S3Error::new(404, "NoSuchKey", "No such internal request.")),
        };
        self.answer_signed(conn, &claim.mac, &answer.to_string(), true)
            .await
    }

    /// A 200 JSON answer to the internal request whose MAC was `request`,
    /// signed (`peer_http::sign_reply`); the connection closes after it
    /// if `close`.
    pub(super) async fn answer_signed(
        &self,
        conn: &mut Conn,
        request: &[u8; 32],
        body: &str,
        close: bool,
    ) -> Result<(), S3Error> {
        let tag = peer_http::sign_reply(
            &self.cluster_key(),
            request,
            200,
            &peer_http::body_hash(body.as_bytes()),
        );
        let head = ResponseHead::new(200)
            .with_header("Content-Type", "application/json")
            .with_header(peer_http::REPLY_HEADER, tag);
        conn.write_response(&head, body.len() as u64, close).await?;
        conn.write_body(body.as_bytes()).await?;
        Ok(conn.flush().await?)
    }

    /// The deletes another node sent (it authorized them): each key this
    /// node owns is deleted; one it does not own is refused (SlowDown:
    /// the nodes' maps disagree for a moment).
    async fn delete_owned(&self, map: &ShardMap, bucket: &str, items: &[Value]) -> Value {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(32) {
            let calls = chunk.iter().map(|it| async move {
                let key = it["k"].as_str().unwrap_or("");
                if key.is_empty() || key.len() > 1024 || key.contains('\0') {
                    return Err(S3Error::invalid_argument("Invalid key"));
                }
                if map.primary_of(bucket, key) != map.node_id {
                    return Err(slow_down("The cluster map is changing; retry."));
                }
                let pick = match it["v"].as_str() {
                    None => Pick::Current,
                    Some(v) => Pick::parse(v)
                        .ok_or_else(|| S3Error::invalid_argument("Invalid version id specified"))?,
                };
                let removed = self.shard.delete_version(bucket, key, pick).await?;
                let index_key =
                    crate::cluster::replicate::index_key_of(key, removed.version_id.as_deref());
                self.replicate_key(bucket, &index_key).await?;
                Ok(removed)
            });
            for r in futures::future::join_all(calls).await {
                out.push(match r {
                    Ok(rm) => {
                        json!({"existed": rm.existed, "marker": rm.marker, "vid": rm.version_id})
                    }
                    Err(e) => json!({"code": e.code, "message": e.message}),
                });
            }
        }
        Value::Array(out)
    }
}

/// Copies the request body to the peer (re-chunked when it came chunked).
/// Err: the client's side failed; Ok(Err): the peer's side did (it may
/// have answered early).
async fn pass_body(
    conn: &mut Conn,
    peer: &mut glommio::net::TcpStream,
    buf: &mut [u8],
    req: &Request,
) -> Result<Result<(), std::io::Error>, S3Error> {
    let chunked = req.head.body_framing()? == BodyFraming::Chunked;
    loop {
        let n = conn.read_body(buf).await?;
        let mut out = Vec::with_capacity(16);
        if chunked {
            out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        }
        let wrote = async {
            peer.write_all(&out).await?;
            peer.write_all(&buf[..n]).await?;
            if chunked {
                peer.write_all(b"\r\n").await?;
            }
            Ok::<_, std::io::Error>(())
        }
        .await;
        if let Err(e) = wrote {
            return Ok(Err(e));
        }
        if n == 0 {
            return Ok(peer.flush().await);
        }
    }
}

/// A node's page with the keys it holds but does not own (left behind
/// when their placement group moved: GET and DELETE go to the owner, so
/// they are not listed) turned into `Skipped`: they still mark how far
/// the page got.
/// A node's versions page as it is merged across nodes: cut at its first
/// cut key, holding at most `max` versions and other items.
fn versions_page(page: (Vec<ListItem>, bool), max: usize) -> (Vec<ListItem>, bool) {
    cut_at_incomplete(cap_versions(page, max))
}

/// A versions page holds at most `max` versions and other items (the
/// shards' merge bounds keys, each with up to a shard's page of versions):
/// the key where they run out is cut there (not `complete`), and the page
/// ends with it.
fn cap_versions((mut items, more): (Vec<ListItem>, bool), max: usize) -> (Vec<ListItem>, bool) {
    let mut left = max.max(1);
    for at in 0..items.len() {
        let n = match &items[at] {
            ListItem::Versions { versions, .. } => versions.len(),
            _ => 1,
        };
        if n <= left {
            left -= n;
            continue;
        }
        if left == 0 {
            items.truncate(at);
        } else {
            if let ListItem::Versions {
                versions, complete, ..
            } = &mut items[at]
            {
                versions.truncate(left);
                *complete = false;
            }
            items.truncate(at + 1);
        }
        return (items, true);
    }
    (items, more)
}

/// A versions page ends at its first key whose versions were cut (the
/// shards' merge goes on past it with the other shards' keys, but the
/// cut shard's keys after it are not in the page): cut there, so that a
/// merge across nodes resumes from it (`own_items` may make it a
/// `Skipped` mark, which still cuts the merged page).
fn cut_at_incomplete((mut items, more): (Vec<ListItem>, bool)) -> (Vec<ListItem>, bool) {
    let first = items.iter().position(|i| {
        matches!(
            i,
            ListItem::Versions {
                complete: false,
                ..
            }
        )
    });
    match first {
        Some(at) => {
            items.truncate(at + 1);
            (items, true)
        }
        None => (items, more),
    }
}

fn own_items(map: &ShardMap, bucket: &str, items: Vec<ListItem>) -> Vec<ListItem> {
    items
        .into_iter()
        .map(|i| match i {
            ListItem::Object { ref key, .. } | ListItem::Versions { ref key, .. }
                if map.primary_of(bucket, key) != map.node_id =>
            {
                ListItem::Skipped(key.clone())
            }
            other => other,
        })
        .collect()
}

fn removed_of(v: &Value) -> Result<Removed, S3Error> {
    if let Some(code) = v["code"].as_str() {
        let status = match code {
            "AccessDenied" => 403,
            "NoSuchKey" | "NoSuchBucket" | "NoSuchVersion" => 404,
            "InvalidArgument" => 400,
            "MethodNotAllowed" => 405,
            "ServiceUnavailable" | "SlowDown" => 503,
            "InsufficientStorage" => 507,
            _ => 500,
        };
        return Err(S3Error::new(
            status,
            static_code(code),
            v["message"].as_str().unwrap_or("").to_string(),
        ));
    }
    Ok(Removed {
        existed: v["existed"].as_bool().unwrap_or(false),
        marker: v["marker"].as_bool().unwrap_or(false),
        version_id: v["vid"].as_str().map(str::to_string),
    })
}

/// A node's listing page for another node, as JSON: `["o", key, size,
/// etag, mtime_ms]`, `["p", prefix]` or `["s", key]` (nothing to list up to
/// there), and whether the page was cut.
fn list_answer(items: &[ListItem], truncated: bool) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|i| match i {
            ListItem::Object {
                key,
                size_bytes,
                etag,
                mtime_ms,
            } => json!(["o", key, size_bytes, &**etag, mtime_ms]),
            ListItem::Prefix(p) => json!(["p", p]),
            ListItem::Skipped(k) => json!(["s", k]),
            // A key's versions, newest first: [id|null, place, latest,
            // size|null, ETag|null (a delete marker: both null), time].
            ListItem::Versions {
                key,
                versions,
                complete,
            } => {
                let vs: Vec<Value> = versions
                    .iter()
                    .map(|v| {
                        let (size, etag) = match &v.object {
                            Some((size, etag)) => (json!(size), json!(&**etag)),
                            None => (Value::Null, Value::Null),
                        };
                        json!([
                            v.version.map(|id| version_id(Some(id))),
                            v.order,
                            v.latest,
                            size,
                            etag,
                            v.mtime_ms
                        ])
                    })
                    .collect();
                json!(["v", key, complete, vs])
            }
        })
        .collect();
    json!({"items": items, "truncated": truncated})
}

fn parse_list_answer(status: u16, body: &[u8]) -> Result<(Vec<ListItem>, bool), String> {
    if status != 200 {
        return Err(format!(
            "listing answered {status}: {}",
            String::from_utf8_lossy(body)
        ));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("bad listing: {e}"))?;
    let items = v["items"].as_array().ok_or("bad listing: no items")?;
    let mut out = Vec::with_capacity(items.len());
    for it in items {
        let s = |i: usize| it[i].as_str().map(str::to_string).ok_or("bad listing item");
        out.push(match it[0].as_str() {
            Some("o") => ListItem::Object {
                key: s(1)?,
                size_bytes: it[2].as_u64().ok_or("bad listing size")?,
                etag: s(3)?.into(),
                mtime_ms: it[4].as_u64().ok_or("bad listing time")?,
            },
            Some("p") => ListItem::Prefix(s(1)?),
            Some("s") => ListItem::Skipped(s(1)?),
            Some("v") => ListItem::Versions {
                key: s(1)?,
                complete: it[2].as_bool().ok_or("bad listing item")?,
                versions: it[3]
                    .as_array()
                    .ok_or("bad listing item")?
                    .iter()
                    .map(parse_version_entry)
                    .collect::<Result<_, _>>()?,
            },
            _ => return Err("bad listing item".into()),
        });
    }
    Ok((out, v["truncated"].as_bool().unwrap_or(false)))
}

/// One version of a listing answer's `"v"` item (`list_answer`).
fn parse_version_entry(v: &Value) -> Result<VersionEntry, String> {
    let bad = || "bad listing version".to_string();
    let version = match &v[0] {
        Value::Null => None,
        Value::String(id) => match Pick::parse(id) {
            Some(Pick::Id(id)) => Some(id),
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    let object = match (&v[3], &v[4]) {
        (Value::Null, Value::Null) => None,
        (size, Value::String(etag)) => Some((size.as_u64().ok_or_else(bad)?, etag.as_str().into())),
        _ => return Err(bad()),
    };
    Ok(VersionEntry {
        version,
        order: v[1].as_u64().ok_or_else(bad)?,
        latest: v[2].as_bool().ok_or_else(bad)?,
        object,
        mtime_ms: v[5].as_u64().ok_or_else(bad)?,
    })
}

/// Nodes' pages of one listing merged into one page of at most `max`
/// items. A node whose page was cut has not shown what follows its last
/// item, so the merged page ends there at the latest; equal common
/// prefixes from several nodes are one item.
pub(super) fn merge_listings(
    pages: Vec<(Vec<ListItem>, bool)>,
    max: usize,
) -> (Vec<ListItem>, bool) {
    let cutoff: Option<String> = pages
        .iter()
        .filter(|(_, cut)| *cut)
        .filter_map(|(items, _)| items.last().map(|i| i.name().to_string()))
        .min();
    let mut all: Vec<ListItem> = pages.into_iter().flat_map(|(items, _)| items).collect();
    // Equal names: a key or prefix before a Skipped mark, so that the
    // one kept is the one to list.
    let rank = |i: &ListItem| u8::from(matches!(i, ListItem::Skipped(_)));
    all.sort_by(|a, b| a.name().cmp(b.name()).then(rank(a).cmp(&rank(b))));
    all.dedup_by(|a, b| a.name() == b.name());
    if let Some(cut) = &cutoff {
        all.retain(|i| i.name() <= cut.as_str());
    }
    let truncated = cutoff.is_some() || all.len() > max;
    all.truncate(max);
    (all, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn obj(k: &str) -> ListItem {
        ListItem::Object {
            key: k.into(),
            size_bytes: 1,
            etag: "e".into(),
            mtime_ms: 1,
        }
    }

    /// Paging through merged pages lists every key once, in order, however
    /// the keys are spread over nodes and whatever the page size.
    #[test]
    fn merged_listings_page_through_every_key_once() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..300 {
            let nodes = rng.gen_range(1..5);
            let mut per: Vec<Vec<String>> = vec![Vec::new(); nodes];
            let mut all: Vec<String> = (0..rng.gen_range(0..150))
                .map(|i| format!("k{i:05}"))
                .collect();
            all.sort();
            for k in &all {
                per[rng.gen_range(0..nodes)].push(k.clone());
            }
            let max = rng.gen_range(1..30);
            let mut from = String::new();
            let mut got = Vec::new();
            for _ in 0..1000 {
                let pages = per
                    .iter()
                    .map(|keys| {
                        let rest: Vec<&String> = keys.iter().filter(|k| **k > from).collect();
                        let cut = rest.len() > max;
                        (rest.into_iter().take(max).map(|k| obj(k)).collect(), cut)
                    })
                    .collect();
                let (items, truncated) = merge_listings(pages, max);
                assert!(items.len() <= max);
                got.extend(items.iter().map(|i| i.name().to_string()));
                if !truncated {
                    break;
                }
                from = items
                    .last()
                    .expect("a cut page has items")
                    .name()
                    .to_string();
            }
            assert_eq!(got, all, "round {round}");
        }
    }

    #[test]
    fn list_answers_round_trip() {
        let items = vec![
            obj("a"),
            ListItem::Prefix("b/".into()),
            ListItem::Skipped("c".into()),
        ];
        let v = list_answer(&items, true);
        let (back, cut) = parse_list_answer(200, v.to_string().as_bytes()).unwrap();
        assert!(cut);
        assert_eq!(
            back.iter().map(ListItem::name).collect::<Vec<_>>(),
            ["a", "b/", "c"]
        );
        assert!(parse_list_answer(200, b"{\"items\":[[\"x\"]]}").is_err());
        assert!(parse_list_answer(500, b"").is_err());
    }

    fn versions(k: &str, ids: &[Option<u64>], complete: bool) -> ListItem {
        ListItem::Versions {
            key: k.into(),
            versions: ids
                .iter()
                .enumerate()
                .map(|(i, &version)| VersionEntry {
                    version,
                    order: version.unwrap_or(7),
                    latest: i == 0,
                    object: (i % 2 == 0).then(|| (i as u64, format!("e{i}").into())),
                    mtime_ms: 1_000 + i as u64,
                })
                .collect(),
            complete,
        }
    }

    /// A versions page travels whole (ids, places, latest, markers,
    /// sizes, ETags, times, whether complete); a hostile peer's bad item
    /// is refused.
    #[test]
    fn version_answers_round_trip() {
        let items = vec![
            versions("a", &[Some(1 << 41), None, Some(5)], true),
            ListItem::Skipped("b".into()),
            versions("c", &[Some(3)], false),
        ];
        let v = list_answer(&items, false);
        let (back, cut) = parse_list_answer(200, v.to_string().as_bytes()).unwrap();
        assert!(!cut);
        assert_eq!(back, items);
        for bad in [
            r#"{"items":[["v","a",true,[["null",1,true,null,null,1]]]]}"#,
            r#"{"items":[["v","a",true,[["zz",1,true,null,null,1]]]]}"#,
            r#"{"items":[["v","a",true,[[null,1,true,5,null,1]]]]}"#,
            r#"{"items":[["v","a",1,[]]]}"#,
        ] {
            assert!(parse_list_answer(200, bad.as_bytes()).is_err(), "{bad}");
        }
    }

    /// A versions page is cut at its first key whose versions were cut:
    /// the keys the shards' merge put after it may miss some of the cut
    /// shard's (the merged page across nodes must resume from it).
    #[test]
    fn a_versions_page_ends_at_its_first_cut_key() {
        let page = vec![
            versions("a", &[Some(1)], true),
            versions("b", &[Some(2)], false),
            versions("c", &[Some(3)], true),
        ];
        let (items, more) = cut_at_incomplete((page.clone(), false));
        assert!(more);
        assert_eq!(
            items.iter().map(ListItem::name).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let whole = vec![page[0].clone(), page[2].clone()];
        assert_eq!(cut_at_incomplete((whole.clone(), false)), (whole, false));
    }

    /// A node's versions page holds at most `max` versions: the key where
    /// they run out is cut there (not complete) and ends the page.
    #[test]
    fn a_versions_page_holds_at_most_max_versions() {
        let ids = |n: u64| (1..=n).map(Some).collect::<Vec<_>>();
        let page = vec![
            versions("a", &ids(3), true),
            ListItem::Skipped("b".into()),
            versions("c", &ids(4), true),
        ];
        let count = |items: &[ListItem]| -> usize {
            items
                .iter()
                .map(|i| match i {
                    ListItem::Versions { versions, .. } => versions.len(),
                    _ => 1,
                })
                .sum()
        };
        // Everything fits: as it was.
        assert_eq!(
            cap_versions((page.clone(), false), 8),
            (page.clone(), false)
        );
        for max in 1..8 {
            let (items, more) = cap_versions((page.clone(), false), max);
            assert!(more, "max {max}");
            assert!(count(&items) <= max, "max {max}: {items:?}");
            // Every version kept is the page's, in order.
            for (got, want) in items.iter().zip(&page) {
                match (got, want) {
                    (
                        ListItem::Versions { key, versions, .. },
                        ListItem::Versions {
                            key: k2,
                            versions: v2,
                            ..
                        },
                    ) => {
                        assert_eq!(key, k2);
                        assert_eq!(versions[..], v2[..versions.len()]);
                    }
                    (g, w) => assert_eq!(g, w),
                }
            }
            // Cut within a key: it is the last item and not complete.
            if let Some(ListItem::Versions {
                versions,
                complete,
                key,
            }) = items.last()
            {
                let whole = page.iter().any(|p| matches!(p, ListItem::Versions { key: k, versions: v, .. } if k == key && v.len() == versions.len()));
                assert_eq!(*complete, whole, "max {max}: {items:?}");
            }
        }
    }
}
