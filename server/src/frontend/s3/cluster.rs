//! The S3 door of a cluster node (`serve --cluster`; docs/cluster.md,
//! "S3 on a cluster"): any node serves any key.
//!
//! - A request about a key whose placement group another node is the
//!   primary of is forwarded to that node's S3 port, the client's signed
//!   request as it came (the owner checks the signature again), and the
//!   answer streamed back. The owner serves a forwarded request itself or,
//!   if its map disagrees, answers 503 SlowDown; it never forwards again.
//! - Bucket changes (create, delete, versioning, policy, tags, CORS,
//!   lifecycle, ACL) are sent to every node that is up or draining, this
//!   one included, so that every node holds the same buckets.
//! - ListObjects (V1, V2) merges this node's page with every other
//!   serving node's (`/_percore/list`), with the paging guarantees of a
//!   single node; DeleteObjects deletes each key on its owner
//!   (`/_percore/delete`).
//!
//! Node-to-node requests are authenticated with `x-percore-node`
//! (`cluster::peer_http`).

use std::net::SocketAddr;

use futures_lite::AsyncWriteExt;
use serde_json::{json, Value};

use super::route::S3Op;
use super::{Conn, Request, S3Front};
use crate::access::Principal;
use crate::cluster::peer_http::{self, Claim};
use crate::cluster::shardmap::ShardMap;
use crate::frontend::http::{BodyFraming, ResponseHead};
use crate::frontend::s3::error::S3Error;
use crate::metrics::ShardMetrics;
use crate::shard::msg::Removed;
use crate::store::versions::Pick;
use crate::store::ListItem;

/// Largest internal answer (a listing page of 1,000 keys is ~200 KB).
const INTERNAL_ANSWER_MAX: usize = 16 << 20;
/// Largest bucket-change body fanned out (the XML documents).
const FANOUT_BODY_MAX: usize = 1 << 20;
/// Request headers not passed on (hop by hop, or ours).
const HOP_HEADERS: [&str; 9] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "expect",
    "proxy-connection",
    "trailer",
    peer_http::HEADER,
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

/// What a cluster node does with a request.
pub(super) enum Plan {
    /// Serve it here (a single node, or this node owns the key).
    Here,
    /// Forward it to the key's owner.
    Forward(SocketAddr),
    /// Send it to every serving node (a bucket change).
    FanOut(Vec<SocketAddr>),
}

fn unavailable(message: impl Into<String>) -> S3Error {
    S3Error::new(503, "ServiceUnavailable", message)
}

fn slow_down(message: impl Into<String>) -> S3Error {
    S3Error::new(503, "SlowDown", message)
}

fn is_bucket_change(op: S3Op) -> bool {
    matches!(
        op,
        S3Op::CreateBucket
            | S3Op::DeleteBucket
            | S3Op::PutBucketVersioning
            | S3Op::PutBucketAcl
            | S3Op::PutBucketTagging
            | S3Op::PutBucketCors
            | S3Op::PutBucketLifecycleConfiguration
            | S3Op::PutBucketPolicy
            | S3Op::DeleteBucketTagging
            | S3Op::DeleteBucketCors
            | S3Op::DeleteBucketLifecycle
            | S3Op::DeleteBucketPolicy
    )
}

/// A principal as node-to-node requests name it.
fn principal_name(p: &Principal) -> String {
    match p {
        Principal::Root => "root".into(),
        Principal::User(name) => format!("user:{name}"),
        Principal::Anonymous => "-".into(),
    }
}

/// The static code of an error a peer reported (unknown ones are
/// internal errors).
fn static_code(code: &str) -> &'static str {
    const KNOWN: [&str; 10] = [
        "AccessDenied",
        "NoSuchKey",
        "NoSuchBucket",
        "NoSuchVersion",
        "InvalidArgument",
        "MethodNotAllowed",
        "ServiceUnavailable",
        "SlowDown",
        "XMinioStorageFull",
        "InternalError",
    ];
    KNOWN
        .into_iter()
        .find(|k| *k == code)
        .unwrap_or("InternalError")
}

impl S3Front {
    /// The cluster map, on a cluster node that has one.
    fn map(&self) -> Result<Option<std::sync::Arc<ShardMap>>, S3Error> {
        if !self.shard.is_cluster() {
            return Ok(None);
        }
        self.shard.cluster_map().map(Some).ok_or_else(|| {
            unavailable("This cluster node has not read the cluster map yet; retry shortly.")
        })
    }

    /// The `x-percore-node` claim of a request another node sent (None:
    /// a client's). A header that does not verify is refused.
    pub(super) fn node_claim(&self, req: &Request) -> Result<Option<Claim>, S3Error> {
        let Some(v) = req.head.header_str(peer_http::HEADER) else {
            return Ok(None);
        };
        if !self.shard.is_cluster() {
            return Err(S3Error::new(
                403,
                "AccessDenied",
                "Node-to-node requests go to cluster nodes only.",
            ));
        }
        let m = self.shard.metrics();
        match peer_http::verify(
            &self.cfg.credentials.secret_key,
            v,
            &req.head.method,
            &req.head.target,
        ) {
            Ok(c) => {
                ShardMetrics::add(&m.cluster_node_requests, 1);
                Ok(Some(c))
            }
            Err(e) => {
                ShardMetrics::add(&m.cluster_node_refused, 1);
                Err(S3Error::new(
                    403,
                    "AccessDenied",
                    format!("Bad node header: {e}"),
                ))
            }
        }
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
        if req.key.is_empty() {
            if claim.is_none() && is_bucket_change(req.op) {
                let mut to: Vec<SocketAddr> = map
                    .node(map.node_id)
                    .and_then(|n| n.s3)
                    .into_iter()
                    .collect();
                for n in map.serving_peers() {
                    to.push(n.s3.ok_or_else(|| {
                        unavailable(format!(
                            "node {} has no usable S3 address in the map",
                            n.name
                        ))
                    })?);
                }
                return Ok(Plan::FanOut(to));
            }
            return Ok(Plan::Here);
        }
        let primary = map.primary_of(&req.bucket, &req.key);
        if primary == map.node_id {
            self.check_copy_source(req, &map)?;
            return Ok(Plan::Here);
        }
        if claim.is_some() {
            return Err(slow_down("The cluster map is changing (the nodes disagree on this key's owner for a moment); retry."));
        }
        let node = map.node(primary).ok_or_else(|| {
            unavailable("No node holds this key's placement group (are any nodes up?).")
        })?;
        let addr = node.s3.ok_or_else(|| {
            unavailable(format!(
                "node {} has no usable S3 address in the map",
                node.name
            ))
        })?;
        Ok(Plan::Forward(addr))
    }

    /// A copy reads its source where it is served: refused when another
    /// node owns the source (reading across nodes is not built yet).
    fn check_copy_source(&self, req: &Request, map: &ShardMap) -> Result<(), S3Error> {
        if !matches!(req.op, S3Op::CopyObject | S3Op::UploadPartCopy) {
            return Ok(());
        }
        let Some(src) = req.head.header_str("x-amz-copy-source") else {
            return Ok(());
        };
        let src = src.split_once("?versionId=").map_or(src, |(s, _)| s);
        let decoded =
            percent_encoding::percent_decode_str(src.trim_start_matches('/')).decode_utf8_lossy();
        let Some((bucket, key)) = decoded.split_once('/') else {
            return Ok(());
        };
        if map.primary_of(bucket, key) != map.node_id {
            return Err(S3Error::not_implemented(
                "copying from an object another cluster node owns (copy within one node's keys, or GET and PUT)",
            ));
        }
        Ok(())
    }

    /// The request head as a peer gets it: the client's own, minus the
    /// hop-by-hop fields, plus `Connection: close` and the node header.
    fn peer_head(&self, req: &Request, framing: Option<u64>, principal: &Principal) -> Vec<u8> {
        let map_node = self.shard.cluster_map().map_or(0, |m| m.node_id);
        let mut h = Vec::with_capacity(1024);
        h.extend_from_slice(
            format!("{} {} HTTP/1.1\r\n", req.head.method, req.head.target).as_bytes(),
        );
        for (name, value) in &req.head.headers {
            if HOP_HEADERS.contains(&name.as_str())
                || (framing.is_some() && name == "content-length")
            {
                continue;
            }
            h.extend_from_slice(name.as_bytes());
            h.extend_from_slice(b": ");
            h.extend_from_slice(value);
            h.extend_from_slice(b"\r\n");
        }
        match framing {
            Some(n) => h.extend_from_slice(format!("content-length: {n}\r\n").as_bytes()),
            None if req.head.body_framing().ok() == Some(BodyFraming::Chunked) => {
                h.extend_from_slice(b"transfer-encoding: chunked\r\n");
            }
            None => {}
        }
        let mac = peer_http::sign(
            &self.cfg.credentials.secret_key,
            map_node,
            &req.head.method,
            &req.head.target,
            &principal_name(principal),
        );
        h.extend_from_slice(
            format!("connection: close\r\n{}: {mac}\r\n\r\n", peer_http::HEADER).as_bytes(),
        );
        h
    }

    /// Forwards `req` to the node at `addr` and streams its answer back.
    pub(super) async fn forward(
        &self,
        conn: &mut Conn,
        req: &Request,
        addr: SocketAddr,
        principal: &Principal,
    ) -> Result<(), S3Error> {
        ShardMetrics::add(&self.shard.metrics().cluster_forwarded, 1);
        let unreachable = |e: std::io::Error| {
            unavailable(format!(
                "The cluster node that owns this key ({addr}) cannot be reached: {e}"
            ))
        };
        let chunked = req.head.body_framing()? == BodyFraming::Chunked;
        let mut peer = peer_http::open(addr).await.map_err(unreachable)?;
        peer.write_all(&self.peer_head(req, None, principal))
            .await
            .map_err(unreachable)?;
        if req.head.expects_continue() {
            conn.send_continue().await?;
        }
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = conn.read_body(&mut buf).await?;
            if chunked {
                peer.write_all(format!("{n:x}\r\n").as_bytes())
                    .await
                    .map_err(unreachable)?;
            }
            if n == 0 {
                if chunked {
                    peer.write_all(b"\r\n").await.map_err(unreachable)?;
                }
                break;
            }
            peer.write_all(&buf[..n]).await.map_err(unreachable)?;
            if chunked {
                peer.write_all(b"\r\n").await.map_err(unreachable)?;
            }
        }
        peer.flush().await.map_err(unreachable)?;
        let resp = peer_http::read_response(peer).await.map_err(unreachable)?;
        self.relay(conn, req, resp, &mut buf).await
    }

    /// Writes a peer's answer to the client.
    async fn relay(
        &self,
        conn: &mut Conn,
        req: &Request,
        mut resp: peer_http::Response,
        buf: &mut [u8],
    ) -> Result<(), S3Error> {
        let mut head = ResponseHead::new(resp.status);
        for (n, v) in &resp.headers {
            if OWN_RESPONSE_HEADERS.contains(&n.as_str()) || n.starts_with("access-control-") {
                continue;
            }
            head.push_header(n.clone(), v.clone());
        }
        let bodiless =
            req.head.method == "HEAD" || matches!(resp.status, 204 | 304) || resp.status < 200;
        if bodiless {
            conn.write_response(&head, resp.content_length().unwrap_or(0), false)
                .await?;
            return Ok(conn.flush().await?);
        }
        if resp.is_chunked() {
            if !conn.request_is_http11() {
                return Err(S3Error::internal(
                    "the owner node answered in chunks, which an HTTP/1.0 client cannot read",
                ));
            }
            // Passed on as it came (still chunk-encoded), to the close.
            conn.write_response_chunked(&head).await?;
            loop {
                let n = resp
                    .read(buf)
                    .await
                    .map_err(|e| S3Error::internal(e.to_string()))?;
                if n == 0 {
                    return Ok(conn.flush().await?);
                }
                conn.write_body(&buf[..n]).await?;
            }
        }
        let Some(len) = resp.content_length() else {
            let body = resp
                .body(INTERNAL_ANSWER_MAX)
                .await
                .map_err(|e| S3Error::internal(e.to_string()))?;
            conn.write_response(&head, body.len() as u64, false).await?;
            conn.write_body(&body).await?;
            return Ok(conn.flush().await?);
        };
        conn.write_response(&head, len, false).await?;
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
        Ok(conn.flush().await?)
    }

    /// Sends a bucket change to every serving node (this one included,
    /// through its own S3 port) and answers with one node's answer: a
    /// success when every node succeeded (a node that already had the
    /// bucket, or had already lost it, counts for a create or a delete),
    /// else the first failure.
    pub(super) async fn fan_out(
        &self,
        conn: &mut Conn,
        req: &Request,
        to: Vec<SocketAddr>,
        principal: &Principal,
    ) -> Result<(), S3Error> {
        ShardMetrics::add(&self.shard.metrics().cluster_fanned_out, 1);
        let body = self.read_small_body(conn, req, FANOUT_BODY_MAX).await?;
        if req.op == S3Op::DeleteBucket {
            self.check_empty_everywhere(&req.bucket, &to).await?;
        }
        let head = self.peer_head(req, Some(body.len() as u64), principal);
        let calls = to.iter().map(|&addr| {
            let (head, body) = (&head, &body);
            async move {
                let mut s = peer_http::open(addr).await?;
                s.write_all(head).await?;
                s.write_all(body).await?;
                s.flush().await?;
                let r = peer_http::read_response(s).await?;
                let (status, headers) = (r.status, r.headers.clone());
                Ok::<_, std::io::Error>((status, headers, r.body(INTERNAL_ANSWER_MAX).await?))
            }
        });
        let answers = futures::future::join_all(calls).await;
        let (mut ok, mut failed, mut benign) = (None, None, None);
        for (addr, got) in to.iter().zip(answers) {
            let (status, headers, body) = got.map_err(|e| unavailable(format!("cluster node {addr} did not take the bucket change: {e}; retry (until it succeeds the change holds on some nodes only)")))?;
            let text = String::from_utf8_lossy(&body);
            // A node that already had the new bucket, or had already lost
            // the deleted one (a retry after a partial change).
            let done_before = match req.op {
                S3Op::CreateBucket => text.contains("<Code>BucketAlreadyOwnedByYou</Code>"),
                S3Op::DeleteBucket => text.contains("<Code>NoSuchBucket</Code>"),
                _ => false,
            };
            let slot = match (status, done_before) {
                (200..=299, _) => &mut ok,
                (_, true) => &mut benign,
                _ => &mut failed,
            };
            slot.get_or_insert((status, headers, body));
        }
        let Some((status, headers, body)) = failed.or(ok).or(benign) else {
            return Err(unavailable("no cluster node took the bucket change"));
        };
        let mut head = ResponseHead::new(status);
        for (n, v) in headers {
            if !OWN_RESPONSE_HEADERS.contains(&n.as_str()) && !n.starts_with("access-control-") {
                head.push_header(n, v);
            }
        }
        conn.write_response(&head, body.len() as u64, false).await?;
        if req.head.method != "HEAD" {
            conn.write_body(&body).await?;
        }
        Ok(conn.flush().await?)
    }

    /// DeleteBucket on a cluster: refused (BucketNotEmpty) before any node
    /// deletes it when any node holds a version of any key, so that a
    /// node without keys does not lose the bucket while the others keep
    /// theirs. (A key written between this check and the deletes still
    /// splits them; delete an emptied bucket only.)
    async fn check_empty_everywhere(&self, bucket: &str, to: &[SocketAddr]) -> Result<(), S3Error> {
        let me = self.shard.cluster_map().map_or(0, |m| m.node_id);
        let enc = percent_encoding::utf8_percent_encode(bucket, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
        let target =
            format!("/_percore/list?bucket={enc}&prefix=&from=&delimiter=&max=1&versions=1");
        let calls = to.iter().map(|&addr| {
            let target = &target;
            async move {
                let mac =
                    peer_http::sign(&self.cfg.credentials.secret_key, me, "GET", target, "root");
                let (status, body) =
                    peer_http::call(addr, "GET", target, &mac, b"", INTERNAL_ANSWER_MAX)
                        .await
                        .map_err(|e| {
                            unavailable(format!("cluster node {addr} cannot be reached: {e}"))
                        })?;
                parse_list_answer(status, &body)
                    .map_err(|e| S3Error::internal(format!("node {addr}: {e}")))
            }
        });
        for got in futures::future::join_all(calls).await {
            if !got?.0.is_empty() {
                return Err(S3Error::new(
                    409,
                    "BucketNotEmpty",
                    "The bucket you tried to delete is not empty.",
                ));
            }
        }
        Ok(())
    }

    /// ListObjects on a cluster: this node's items merged with every
    /// other serving node's.
    pub(super) async fn list_cluster(
        &self,
        local: (Vec<ListItem>, bool),
        bucket: &str,
        prefix: &str,
        from: &str,
        delimiter: Option<&str>,
        max: usize,
    ) -> Result<(Vec<ListItem>, bool), S3Error> {
        let Some(map) = self.map()? else {
            return Ok(local);
        };
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let target = format!(
            "/_percore/list?bucket={}&prefix={}&from={}&delimiter={}&max={max}",
            enc(bucket),
            enc(prefix),
            enc(from),
            enc(delimiter.unwrap_or(""))
        );
        let me = map.node_id;
        let calls = map.serving_peers().map(|n| {
            let target = &target;
            let (addr, name) = (n.s3, n.name.clone());
            async move {
                let addr = addr
                    .ok_or_else(|| unavailable(format!("node {name} has no usable S3 address")))?;
                let mac =
                    peer_http::sign(&self.cfg.credentials.secret_key, me, "GET", target, "root");
                let (status, body) =
                    peer_http::call(addr, "GET", target, &mac, b"", INTERNAL_ANSWER_MAX)
                        .await
                        .map_err(|e| {
                            unavailable(format!(
                                "cluster node {name} cannot be reached for the listing: {e}"
                            ))
                        })?;
                parse_list_answer(status, &body)
                    .map_err(|e| S3Error::internal(format!("node {name}: {e}")))
            }
        });
        let mut pages = vec![local];
        for got in futures::future::join_all(calls).await {
            pages.push(got?);
        }
        Ok(merge_listings(pages, max))
    }

    /// Deletes `keys` (index, key, version) on the nodes that own them;
    /// the results by index. Keys this node owns are not among them.
    pub(super) async fn delete_remote(
        &self,
        bucket: &str,
        keys: Vec<(usize, String, Option<String>)>,
    ) -> Result<Vec<(usize, Result<Removed, S3Error>)>, S3Error> {
        let Some(map) = self.map()? else {
            return Ok(Vec::new());
        };
        let mut groups: std::collections::BTreeMap<u32, Vec<(usize, String, Option<String>)>> =
            Default::default();
        for k in keys {
            groups
                .entry(map.primary_of(bucket, &k.1))
                .or_default()
                .push(k);
        }
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
                let Some(addr) = map.node(node).and_then(|n| n.s3) else {
                    return fail(unavailable("the node that owns this key is not in the map"));
                };
                let body = Value::Array(
                    items
                        .iter()
                        .map(|(_, k, v)| json!({"k": k, "v": v}))
                        .collect(),
                )
                .to_string();
                let mac = peer_http::sign(
                    &self.cfg.credentials.secret_key,
                    map.node_id,
                    "POST",
                    target,
                    "root",
                );
                let got = peer_http::call(
                    addr,
                    "POST",
                    target,
                    &mac,
                    body.as_bytes(),
                    INTERNAL_ANSWER_MAX,
                )
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
                        "the cluster node that owns this key ({addr}) did not answer the delete"
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

    /// `/_percore/...`: requests from other nodes (authenticated by their
    /// MAC). Answers JSON; the connection closes after.
    pub(super) async fn internal(&self, conn: &mut Conn, req: &Request) -> Result<(), S3Error> {
        self.node_claim(req)?.ok_or_else(|| {
            S3Error::new(
                403,
                "AccessDenied",
                "Internal requests come from cluster nodes.",
            )
        })?;
        let q = |name: &str| req.q(name).unwrap_or("").to_string();
        let answer = match (req.head.method.as_str(), req.head.path.as_str()) {
            ("GET", "/_percore/list") => {
                let max: usize = q("max")
                    .parse()
                    .map_err(|_| S3Error::invalid_argument("bad max"))?;
                let delimiter = Some(q("delimiter")).filter(|d| !d.is_empty());
                // versions=1: every version and delete marker counts.
                let versions = (q("versions") == "1").then_some(None);
                match self
                    .shard
                    .list_merged(
                        &q("bucket"),
                        &q("prefix"),
                        &q("from"),
                        delimiter,
                        max.clamp(1, 10_000),
                        versions,
                    )
                    .await
                {
                    Ok((items, truncated)) => list_answer(&items, truncated),
                    Err(crate::shard::msg::ShardError::NoSuchBucket) => list_answer(&[], false),
                    Err(e) => return Err(e.into()),
                }
            }
            ("POST", "/_percore/delete") => {
                let body = self
                    .read_small_body(conn, req, super::xml::PARSE_BODY_BYTES_MAX * 2)
                    .await?;
                let items: Vec<Value> = serde_json::from_slice(&body)
                    .map_err(|e| S3Error::invalid_argument(format!("bad delete list: {e}")))?;
                self.delete_owned(&q("bucket"), &items).await?
            }
            _ => return Err(S3Error::new(404, "NoSuchKey", "No such internal request.")),
        };
        let head = ResponseHead::new(200).with_header("Content-Type", "application/json");
        let body = answer.to_string();
        conn.write_response(&head, body.len() as u64, true).await?;
        conn.write_body(body.as_bytes()).await?;
        Ok(conn.flush().await?)
    }

    /// The deletes another node sent (it authorized them): each key this
    /// node owns is deleted; one it does not own is refused (SlowDown:
    /// the nodes' maps disagree for a moment).
    async fn delete_owned(&self, bucket: &str, items: &[Value]) -> Result<Value, S3Error> {
        let map = self
            .map()?
            .ok_or_else(|| S3Error::internal("not a cluster node"))?;
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(32) {
            let calls = chunk.iter().map(|it| {
                let map = &map;
                async move {
                    let key = it["k"].as_str().unwrap_or("");
                    if key.is_empty() || key.len() > 1024 || key.contains('\0') {
                        return Err(S3Error::invalid_argument("Invalid key"));
                    }
                    if map.primary_of(bucket, key) != map.node_id {
                        return Err(slow_down("The cluster map is changing; retry."));
                    }
                    let pick = match it["v"].as_str() {
                        None => Pick::Current,
                        Some(v) => Pick::parse(v).ok_or_else(|| {
                            S3Error::invalid_argument("Invalid version id specified")
                        })?,
                    };
                    Ok(self.shard.delete_version(bucket, key, pick).await?)
                }
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
        Ok(Value::Array(out))
    }
}

fn removed_of(v: &Value) -> Result<Removed, S3Error> {
    if let Some(code) = v["code"].as_str() {
        let status = match code {
            "AccessDenied" => 403,
            "NoSuchKey" | "NoSuchBucket" | "NoSuchVersion" => 404,
            "InvalidArgument" => 400,
            "MethodNotAllowed" => 405,
            "ServiceUnavailable" | "SlowDown" => 503,
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
            // A key's versions (a versions listing): listed as the key.
            ListItem::Versions { key, .. } => json!(["s", key]),
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
            _ => return Err("bad listing item".into()),
        });
    }
    Ok((out, v["truncated"].as_bool().unwrap_or(false)))
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
    all.sort_by(|a, b| a.name().cmp(b.name()));
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
}
