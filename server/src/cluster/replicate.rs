//! Replication (issue 18): a placement group's acting primary orders every
//! write of its keys and copies the key's resulting state to the group's
//! other replicas before the write is acknowledged; a node that joins
//! (or comes back) catches up from the groups' primaries before it acts
//! as a primary itself. Everything here runs on a shard (glommio), over
//! node-to-node HTTP on the S3 port (`peer_http`); only a write whose copy
//! failed on a replica waits for etcd (through the control thread).
//!
//! **State transfer, not operation shipping.** What crosses is the key's
//! state after the write: its current version (metadata and bytes) or its
//! tombstone, with the version's stamp (`store::STAMP_HEADER`), a hybrid
//! clock strictly increasing per key on the node that ordered the write.
//! A replica installs a copy only over an older stamp
//! (`PutCondition::IfNewer`), so copies may arrive in any order, twice, or
//! late, and every replica ends with the newest.
//!
//! **Acknowledgement.** A write is acknowledged when at least a majority
//! of the group's R (the primary counting itself) hold its stamp or a
//! newer one, and every other replica that is `up` in the primary's map
//! either holds it too or was recorded in etcd as having missed it
//! (`map::skip`: its `skipped/<id>` key moved, and it was marked not
//! synced if it was synced). Otherwise the client gets 503 (the write may
//! be on some replicas: it was not acknowledged, and a later write or the
//! primary's state wins). A skipped replica (down but not yet marked,
//! cut off from the primary, a sick disk) leads nothing before it caught
//! up again under a map read after the skip (`map::mark_synced` compares
//! the key), from a synced primary that holds the write, and it reports
//! itself synced only once it reaches every up node it shares a group
//! with (`reach_peers`). Once a majority holds a write, the other copies
//! get at least `STRAGGLER_WAIT` (or as long as the majority took) before
//! they are skipped.
//!
//! **Fencing.** A replica refuses a copy from a node that is not the
//! group's acting primary in its own map (when its map is at least as new
//! as the sender's), and a copy sent under a map older than the epoch at
//! which a catching-up node read its digest (`Shard::fence`, raised by
//! every digest read and checked again after the copy is installed). The
//! primary checks its own key shard's fence before it acknowledges: a
//! write that raced a catch-up is copied again under the newer map (which
//! names the catching-up node). So a write acknowledged under an older
//! map is in the digest the catching-up node read, or it was copied to
//! that node too.
//!
//! Wire (node-authenticated like every `/_percore/` request):
//!
//! ```text
//! PUT  /_percore/push?bucket=B&key=K   x-percore-state: base64(JSON state), body: the bytes
//!      (the node MAC's body hash is the SHA-256 of the state JSON; the
//!      bytes are checked against the state's MD5 and size)
//! GET  /_percore/fetch?bucket=B&key=K  answer: x-percore-state and the bytes
//! POST /_percore/digest {"epoch":E,"pgs":[..]|null,"after":[b,k]|null,"limit":N}
//!      answer: {"items":[[bucket,key,stamp,etag|null]],"next":[b,k]|null}
//! POST /_percore/release {"epoch":E}
//!      answer (once the receiver leads under no map older than E):
//!      {"released":E}; 503 if it cannot say so within RELEASE_WAIT
//! ```
//!
//! **Releases.** A node that leads a group another node may still lead
//! under an older map (that node is still up and does not hold the group
//! now) waits before it leads it (`ShardMap::set_takeovers`,
//! `control::may_lead`), unless that node releases first: shard 0 asks it
//! (`start_releases`), and its answer means it has read the map and leads
//! under none older than E.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use futures_lite::AsyncWriteExt;
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::peer_http::{self, Signed};
use super::shardmap::{MapNode, Report, ShardMap, SkipAsk, SKIP_DONE};
use crate::shard::msg::ShardError;
use crate::shard::object::{ObjectSink, ObjectSource};
use crate::shard::Shard;
use crate::store::record::ObjectMeta;
use crate::store::versions::Pick;
use crate::store::{meta_stamp, PutCondition};
use percore_protocol::placement::NodeState;

/// The header carrying a key's state (base64 of its JSON).
pub const STATE_HEADER: &str = "x-percore-state";
/// What the signature of a fetch's 404 covers (`peer_http::sign_reply`).
pub const FETCH_ABSENT: &str = "absent";

/// What the signature of a fetch's 200 covers: its state header (the
/// state's MD5 covers the bytes).
#[must_use]
pub fn fetch_covered(state_value: &str) -> String {
    format!("state {state_value}")
}
/// Largest copy sent on a kept connection (`send_push`).
const KEPT_PUSH_BYTES_MAX: u64 = 256 * 1024;
/// Bytes read from the store per step of a copy.
const COPY_CHUNK_BYTES: u64 = 1 << 20;
/// How long a write waits for its copies (and for a newer map, when a
/// replica refused its copy as sent under an older one).
const REPLICATE_WAIT: Duration = Duration::from_secs(8);
/// Bytes per second a copy of a large version is given time for, on top
/// of `REPLICATE_WAIT` (a 5 GiB version: 160 s more).
const REPLICATE_RATE_MIN: u64 = 32 << 20;
/// Once a majority holds a write, how long the other replicas get at
/// least (or as long as the majority took, if longer) before they are
/// skipped (`push_all`).
const STRAGGLER_WAIT: Duration = Duration::from_secs(1);
/// `STRAGGLER_WAIT` when a replica is catching up.
const STRAGGLER_WAIT_UNSYNCED: Duration = Duration::from_secs(3);
/// Tries of a copy whose connection broke (a reset, a restart) before it
/// counts as failed, with a growing pause between them (a connect that
/// fails counts at once).
const PUSH_CONNECT_TRIES: u32 = 3;
/// A write with less time than this left is not acknowledged by skipping
/// a replica (`skip`): no replica is marked for a write answered 503.
const SKIP_TIME_MIN: Duration = Duration::from_millis(500);
/// How far ahead of this node's map a peer's may be (maps reach nodes a
/// third of the lease apart; more is a broken or forged peer).
const EPOCH_AHEAD_MAX: u64 = 64;
/// Copies of one key to one replica per write, at most (a replica busy
/// with another copy of the key, or holding another version).
const PUSH_ATTEMPTS: usize = 4;
/// Digest items per request of a catch-up.
const DIGEST_PAGE: usize = 1000;
/// Largest digest answer.
const DIGEST_ANSWER_MAX: usize = 32 << 20;
/// Placement groups compared per step of a catch-up or repair (their
/// digests are held in memory meanwhile).
const GROUPS_PER_PASS: usize = 16;
/// How long a node waits to be marked synced after it reported a pass,
/// before it reports again.
const REPORT_AGAIN: Duration = Duration::from_secs(10);
/// How often a node that is not synced tries to catch up.
const CATCH_UP_EVERY: Duration = Duration::from_millis(500);

/// A key's state as one node holds it: its current version, or its
/// tombstone (`etag` None).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyState {
    /// The sender's map epoch.
    pub epoch: u64,
    pub stamp: u64,
    pub etag: Option<String>,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub mtime_ms: u64,
    #[serde(default)]
    pub content_type: String,
    /// Every stored header (reserved ones included: the stamp, multipart
    /// part sizes, checksums, tags, ACL).
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// Hex MD5 of the bytes.
    #[serde(default)]
    pub md5: String,
    /// With no ETag: a delete marker (its time is the stamp), not a
    /// tombstone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub marker: bool,
}

impl KeyState {
    /// A tombstone stamped `stamp`.
    #[must_use]
    pub fn tombstone(epoch: u64, stamp: u64) -> KeyState {
        KeyState {
            epoch,
            stamp,
            etag: None,
            size: 0,
            mtime_ms: 0,
            content_type: String::new(),
            headers: Vec::new(),
            md5: String::new(),
            marker: false,
        }
    }

    /// A delete marker stamped `stamp`.
    #[must_use]
    pub fn marker(epoch: u64, stamp: u64) -> KeyState {
        KeyState {
            marker: true,
            ..KeyState::tombstone(epoch, stamp)
        }
    }

    /// (JSON, its header value).
    #[must_use]
    pub fn encode(&self) -> (Vec<u8>, String) {
        let json = serde_json::to_vec(self).expect("serializable");
        let value = base64::engine::general_purpose::STANDARD.encode(&json);
        (json, value)
    }

    /// The JSON and the state of a header value.
    pub fn decode(value: &str) -> Result<(Vec<u8>, KeyState), String> {
        let json = base64::engine::general_purpose::STANDARD
            .decode(value.trim())
            .map_err(|e| format!("bad state header: {e}"))?;
        let state: KeyState =
            serde_json::from_slice(&json).map_err(|e| format!("bad state: {e}"))?;
        if state.etag.is_some() && (state.md5.len() != 32 || hex::decode(&state.md5).is_err()) {
            return Err("bad state: no MD5".into());
        }
        if state.etag.is_some() && state.marker {
            return Err("bad state: a delete marker with an ETag".into());
        }
        Ok((json, state))
    }
}

/// The index key a write changed, by the version id its answer names: a
/// real version's (`\0v/KEY\0ID`, replicated as a key of its own), or
/// the key itself (its null version: no id, or "null").
pub fn index_key_of(key: &str, version_id: Option<&str>) -> String {
    match version_id.and_then(Pick::parse) {
        Some(Pick::Id(id)) => crate::store::versions::version_key(key, id),
        _ => key.to_string(),
    }
}

fn is_md5_hex(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// This node's state of the index key `key` of `bucket` (None: nothing
/// stored), with an open source of its bytes: a plain key's null version
/// or a real version's index key (`\0v/KEY\0ID`), each as it is, never a
/// key's current version. The MD5 is the ETag where that is one, and is
/// computed by reading the bytes otherwise (multipart objects).
pub async fn local_state(
    shard: &Rc<Shard>,
    bucket: &str,
    key: &str,
    epoch: u64,
) -> Result<Option<(KeyState, Option<ObjectSource>)>, ShardError> {
    let (plain, pick) = match crate::store::versions::split_version_key(key) {
        Some((plain, id)) => (plain, Pick::Id(id)),
        None => (key, Pick::Null),
    };
    for _ in 0..3 {
        match ObjectSource::open_version(shard, bucket, plain, pick).await {
            Ok((mut src, meta, _)) => {
                let md5 = if is_md5_hex(&meta.etag) {
                    meta.etag.to_ascii_lowercase()
                } else {
                    let mut h = Md5::new();
                    let mut at = 0;
                    while at < meta.size_bytes {
                        let n = COPY_CHUNK_BYTES.min(meta.size_bytes - at);
                        // Shorter at a part's or extent's end.
                        let chunk = src.read(at, n).await?;
                        if chunk.is_empty() {
                            return Err(ShardError::Internal(
                                "an object shorter than its metadata".into(),
                            ));
                        }
                        h.update(&chunk[..]);
                        at += chunk.len() as u64;
                    }
                    hex::encode(h.finalize())
                };
                let state = KeyState {
                    epoch,
                    stamp: meta_stamp(&meta),
                    etag: Some(meta.etag.clone()),
                    size: meta.size_bytes,
                    mtime_ms: meta.mtime_ms,
                    content_type: meta.content_type.clone(),
                    headers: meta.headers.clone(),
                    md5,
                    marker: false,
                };
                return Ok(Some((state, Some(src))));
            }
            Err(
                ShardError::NoSuchKey | ShardError::NoSuchVersion | ShardError::DeleteMarker { .. },
            ) => {
                match shard.key_state(bucket, key).await? {
                    None => return Ok(None),
                    Some((stamp, None, false)) => {
                        return Ok(Some((KeyState::tombstone(epoch, stamp), None)))
                    }
                    Some((stamp, None, true)) => {
                        return Ok(Some((KeyState::marker(epoch, stamp), None)))
                    }
                    // Written between the two reads: read again.
                    Some((_, Some(_), _)) => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(ShardError::Busy)
}

/// Receives a copy of a key's state: a tombstone, or a version whose
/// bytes come through `feed`. Checks size and MD5 before the version can
/// become visible.
pub struct Applier {
    sink: Option<ObjectSink>,
    /// The bytes' MD5, hashed by the shard's engine together with the
    /// other copies and uploads it receives at once.
    engine: Rc<crate::digest::engine::Md5Engine>,
    md5: crate::digest::engine::Md5Job,
    total: u64,
    state: KeyState,
}

/// What applying a copy did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Installed (or a tombstone written).
    Installed,
    /// This node holds the same or a newer stamp already (or, for a
    /// `Replace`, another copy arrived meanwhile): nothing to do.
    Superseded,
}

impl Applier {
    /// Starts applying `state` to `(bucket, key)` under `condition`
    /// (Ok(None): a tombstone, applied already, or a version this node
    /// does not need).
    pub async fn open(
        shard: &Rc<Shard>,
        bucket: &str,
        key: &str,
        state: KeyState,
        condition: PutCondition,
    ) -> Result<Result<Applier, Applied>, ShardError> {
        if state.etag.is_none() {
            let written = shard
                .bodiless_stamped(bucket, key, condition, u64::MAX, state.marker)
                .await?;
            return Ok(Err(if written {
                Applied::Installed
            } else {
                Applied::Superseded
            }));
        }
        let meta = ObjectMeta {
            size_bytes: 0,
            etag: String::new(),
            mtime_ms: state.mtime_ms.max(1),
            content_type: state.content_type.clone(),
            headers: state.headers.clone(),
        };
        let mut opened = ObjectSink::open_part(
            shard,
            bucket,
            key,
            meta.clone(),
            None,
            Some(condition.clone()),
        )
        .await;
        if matches!(opened, Err(ShardError::NoSuchBucket)) {
            // Buckets are cluster-wide: a copy may come before this node
            // applied the catalog that made the bucket; its owner and
            // configuration come when it does (`catalog::apply`).
            shard.create_bucket(bucket, None).await?;
            opened = ObjectSink::open_part(shard, bucket, key, meta, None, Some(condition)).await;
        }
        match opened {
            Ok(sink) => Ok(Ok(Applier {
                sink: Some(sink),
                md5: shard.md5_engine().job(),
                engine: shard.md5_engine(),
                total: 0,
                state,
            })),
            Err(ShardError::PreconditionFailed) => Ok(Err(Applied::Superseded)),
            Err(e) => Err(e),
        }
    }

    pub async fn feed(&mut self, data: Bytes) -> Result<(), ShardError> {
        self.total += data.len() as u64;
        if self.total > self.state.size {
            return Err(ShardError::Internal(
                "the copy is longer than its state says".into(),
            ));
        }
        self.engine.append(&self.md5, &data);
        self.sink.as_mut().expect("open").write(data).await
    }

    pub async fn finish(mut self) -> Result<Applied, ShardError> {
        let md5 = hex::encode(self.engine.finish(&self.md5).await);
        if self.total != self.state.size || md5 != self.state.md5.to_ascii_lowercase() {
            return Err(ShardError::Internal(format!(
                "the copy's bytes do not match its state ({} of {} bytes, MD5 {md5})",
                self.total, self.state.size
            )));
        }
        let sink = self.sink.take().expect("open");
        let etag = self.state.etag.clone().unwrap_or_default();
        match sink.finish(etag).await {
            Ok(_) => Ok(Applied::Installed),
            Err(ShardError::PreconditionFailed) => Ok(Applied::Superseded),
            Err(e) => Err(e),
        }
    }
}

/// What a copy to one replica came to.
#[derive(Debug)]
enum Pushed {
    Applied,
    /// The replica refused it as sent under an older map (or by a node it
    /// does not take as the primary): retry under a newer map.
    Refused(String),
    /// The replica did not take it (unreachable, an error, too slow).
    Failed(String),
    /// This node could not read what to send: the write is refused (503),
    /// and no replica is skipped for it.
    Local(String),
}

/// A push failed reading this node's own bytes (not the replica's fault).
#[derive(Debug)]
struct LocalRead(String);

impl std::fmt::Display for LocalRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LocalRead {}

/// A push could not connect to its replica.
#[derive(Debug)]
struct ConnectFailed(String);

impl std::fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectFailed {}

/// `s` percent-encoded for a query value of a node-to-node request.
pub(crate) fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The node header of a request from this node (`map.node_id`) to `to`.
pub(crate) fn sign(
    ckey: &[u8; 32],
    map: &ShardMap,
    to: u32,
    method: &str,
    target: &str,
    body: &str,
) -> String {
    peer_http::sign(
        ckey,
        &Signed {
            from: map.node_id,
            to,
            method,
            target,
            body,
            relay: None,
        },
    )
}

/// Copies this node's state of `(bucket, key)` to `to`, until `to`
/// holds exactly it: a replica that answers with another version (a
/// leftover of a write that was not acknowledged, stamped higher by
/// another primary's clock) gets this one over it (`Replace`, naming the
/// version it answered), since the acting primary's state is the
/// authority. A replica busy with another copy of the key is asked again.
async fn push_one(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    map: &ShardMap,
    to: &MapNode,
    bucket: &str,
    key: &str,
) -> Pushed {
    let Some(addr) = to.s3 else {
        return Pushed::Failed(format!("node {} has no usable S3 address", to.name));
    };
    let mut replace = None;
    let mut attempts = 0;
    let mut broken = 0;
    while attempts < PUSH_ATTEMPTS {
        let (state, src) = match local_state(shard, bucket, key, map.epoch).await {
            Ok(Some(s)) => s,
            // No version of this id here, an id ahead of this node's
            // clock (a delete naming a version that never was): nothing to
            // copy, so that no replica holds an id that would lift later
            // ones; a replica's leftover of it goes with a repair or a
            // catch-up. An id not ahead gets a tombstone as a key does
            // (a delete retried after its tombstone here was compacted).
            Ok(None)
                if crate::store::versions::split_version_key(key)
                    .is_some_and(|(_, id)| id > crate::store::now_ms()) =>
            {
                return Pushed::Applied;
            }
            // Nothing here (a delete of a key this node holds nothing of):
            // a tombstone, so that a replica's leftover goes too.
            Ok(None) => (KeyState::tombstone(map.epoch, crate::store::now_ms()), None),
            Err(e) => return Pushed::Local(format!("reading the key here: {e:?}")),
        };
        match send_push(
            shard,
            ckey,
            map,
            to.id,
            addr,
            (bucket, key),
            &state,
            src,
            replace,
        )
        .await
        {
            Ok((200, body)) => {
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let stamp = v["stamp"].as_u64();
                let etag = v["etag"].as_str();
                // A tombstone over any tombstone; a delete marker (a
                // version: it hides older ones) only as this one.
                let marker = v["marker"].as_bool() == Some(true);
                let same = match &state.etag {
                    None if state.marker => etag.is_none() && marker && stamp == Some(state.stamp),
                    None => etag.is_none() && !marker,
                    Some(e) => stamp == Some(state.stamp) && etag == Some(e.as_str()),
                };
                if same {
                    return Pushed::Applied;
                }
                replace = Some(stamp);
                attempts += 1;
            }
            Ok((409, body)) => return Pushed::Refused(String::from_utf8_lossy(&body).into_owned()),
            // Busy with another copy of the key: asked again until the
            // push's time runs out (`push_all`), not skipped at once.
            Ok((503, _)) => glommio::timer::sleep(Duration::from_millis(20)).await,
            Ok((status, body)) => {
                return Pushed::Failed(format!(
                    "node {} answered {status}: {}",
                    to.name,
                    String::from_utf8_lossy(&body)
                ))
            }
            Err(e) if e.get_ref().is_some_and(|i| i.is::<LocalRead>()) => {
                return Pushed::Local(format!("reading the key here: {e}"));
            }
            // A blip on a connection made (a reset, a busy replica that
            // closed on a large body it would not read) is tried again
            // before it counts; a refused or unroutable connect is not.
            Err(e)
                if broken < PUSH_CONNECT_TRIES - 1
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::UnexpectedEof
                    )
                    && !e.get_ref().is_some_and(|i| i.is::<ConnectFailed>()) =>
            {
                broken += 1;
                glommio::timer::sleep(Duration::from_millis(50 << broken)).await;
            }
            Err(e) => return Pushed::Failed(format!("node {}: {e}", to.name)),
        }
    }
    Pushed::Failed(format!(
        "node {} did not come to hold this node's version",
        to.name
    ))
}

/// Sends one copy; with `replace` = Some(seen), the receiver takes it
/// over its own version (`PutCondition::Replace`: a repair) only if that
/// is still stamped `seen` (None: nothing stored).
#[allow(clippy::too_many_arguments)]
async fn send_push(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    map: &ShardMap,
    to: u32,
    addr: SocketAddr,
    (bucket, key): (&str, &str),
    state: &KeyState,
    src: Option<ObjectSource>,
    replace: Option<Option<u64>>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut target = format!("/_percore/push?bucket={}&key={}", enc(bucket), enc(key));
    match replace {
        None => {}
        Some(None) => target.push_str("&seen=none"),
        Some(Some(s)) => target.push_str(&format!("&seen={s}")),
    }
    let mut src = src;
    // On a connection kept from an earlier copy, if the peer has one
    // (`peer_http::pool_take`); one the peer closed meanwhile fails
    // before the copy is answered, which is then sent again on a new
    // connection (a copy taken twice changes nothing: stamps). Small
    // copies only: all of one fits the peer's socket buffers, so its
    // kernel acknowledges it at once (`read_response_acked`) however busy
    // the peer's disk; a large one gains little from a kept connection.
    let size = if state.etag.is_some() { state.size } else { 0 };
    let pooled = if size <= KEPT_PUSH_BYTES_MAX {
        peer_http::pool_take(addr)
    } else {
        None
    };
    if let Some(s) = pooled {
        crate::metrics::ShardMetrics::add(&shard.metrics().cluster_kept_connections_used, 1);
        let target = &target;
        let got = push_on(s, true, ckey, map, (to, addr), target, state, src.as_mut()).await;
        if matches!(got, Err(_) | Ok((503, _))) {
            // (A peer that is stopping answers 503 on kept connections.)
            peer_http::pool_forget(addr);
        }
        match got {
            Err(e) if e.get_ref().is_some_and(|i| i.is::<LocalRead>()) => return Err(e),
            // Closed meanwhile, or not acknowledged (cut off since): on a
            // new connection, whose connect fails at once or times out.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::TimedOut
                ) => {}
            other => return other,
        }
    }
    let s = peer_http::open(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), ConnectFailed(e.to_string())))?;
    push_on(
        s,
        false,
        ckey,
        map,
        (to, addr),
        &target,
        state,
        src.as_mut(),
    )
    .await
}

/// `send_push` on connection `s`, which is kept for the next copy to the
/// same address once its answer is read (`peer_http::pool_put`).
#[allow(clippy::too_many_arguments)]
async fn push_on(
    mut s: glommio::net::TcpStream,
    kept: bool,
    ckey: &[u8; 32],
    map: &ShardMap,
    (to, addr): (u32, SocketAddr),
    target: &str,
    state: &KeyState,
    src: Option<&mut ObjectSource>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let (json, value) = state.encode();
    let mac = sign(ckey, map, to, "PUT", target, &peer_http::body_hash(&json));
    let size = if state.etag.is_some() { state.size } else { 0 };
    let head = format!(
        "PUT {target} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {size}\r\n{}: {mac}\r\n{STATE_HEADER}: {value}\r\n\r\n",
        peer_http::HEADER
    );
    s.write_all(head.as_bytes()).await?;
    if let Some(src) = src {
        let mut at = 0;
        while at < size {
            let n = COPY_CHUNK_BYTES.min(size - at);
            // Shorter at a part's or extent's end.
            let chunk = src
                .read(at, n)
                .await
                .map_err(|e| std::io::Error::other(LocalRead(format!("{e:?}"))))?;
            if chunk.is_empty() {
                return Err(std::io::Error::other(LocalRead(
                    "an object shorter than its metadata".into(),
                )));
            }
            s.write_all(&chunk[..]).await?;
            at += chunk.len() as u64;
        }
    }
    s.flush().await?;
    let r = if kept {
        peer_http::read_response_acked(s).await?
    } else {
        peer_http::read_response(s).await?
    };
    let (status, body, back) = r.body_signed_reusable(ckey, &mac, 64 * 1024).await?;
    if let Some(s) = back {
        peer_http::pool_put(addr, s);
    }
    Ok((status, body))
}

/// Waits (at most until `deadline`) for this shard's map to move past
/// `epoch`.
async fn newer_map(shard: &Rc<Shard>, epoch: u64, deadline: Instant) {
    while Instant::now() < deadline {
        if shard.cluster_map().is_some_and(|m| m.epoch > epoch) {
            return;
        }
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
}

/// Pushes `(bucket, key)` of group `pg` to `others` at once; returns
/// each one's outcome (same order). A push not done by `deadline` failed;
/// once a majority of the group holds the write (`counts`: this node's
/// copy and those of replicas that count), the others get as long again
/// as that took (at least `STRAGGLER_WAIT`): a replica that stalls is
/// skipped (`replicate`) rather than holding every write up.
async fn push_all(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    (map, pg): (&ShardMap, u32),
    others: &[&MapNode],
    (bucket, key): (&str, &str),
    deadline: Instant,
) -> Vec<Pushed> {
    use futures::StreamExt;
    let started = Instant::now();
    let left = deadline.saturating_duration_since(started);
    let mut pending: futures::stream::FuturesUnordered<_> = others
        .iter()
        .enumerate()
        .map(|(i, n)| async move {
            let r = crate::frontend::http::timeout::within(
                left,
                push_one(shard, ckey, map, n, bucket, key),
            )
            .await
            .unwrap_or_else(|| Pushed::Failed(format!("node {} did not answer in time", n.name)));
            (i, r)
        })
        .collect();
    let mut results: Vec<Option<Pushed>> = others.iter().map(|_| None).collect();
    let mut applied = own_count(map, pg);
    // A replica catching up is slower (it takes its catch-up too): more
    // time before it is skipped (which would void its pass); not one whose
    // copies failed here lately (cut off: every write would wait).
    let straggle = if others.iter().any(|n| !n.synced && !failed_lately(n.id)) {
        STRAGGLER_WAIT_UNSYNCED
    } else {
        STRAGGLER_WAIT
    };
    // Cut early enough that a skip can still be recorded.
    let last_cut = deadline.checked_sub(SKIP_TIME_MIN * 2).unwrap_or(deadline);
    let mut cut: Option<Instant> = (applied >= map.majority()).then(|| started + straggle);
    loop {
        let next = match cut {
            None => pending.next().await,
            Some(at) => {
                let wait = at.min(last_cut).saturating_duration_since(Instant::now());
                match crate::frontend::http::timeout::within(wait, pending.next()).await {
                    Some(n) => n,
                    None => break,
                }
            }
        };
        let Some((i, r)) = next else {
            break;
        };
        if matches!(r, Pushed::Applied) && counts(map, pg, others[i].id) {
            applied += 1;
            if cut.is_none() && applied >= map.majority() {
                cut = Some(Instant::now() + started.elapsed().max(straggle));
            }
        }
        results[i] = Some(r);
    }
    others
        .iter()
        .zip(results)
        .map(|(n, r)| {
            r.unwrap_or_else(|| {
                Pushed::Failed(format!(
                    "node {} did not take the copy in time after a majority held it",
                    n.name
                ))
            })
        })
        .collect()
}

thread_local! {
    /// Per shard (thread): when a copy to each node last failed here.
    static FAILED_AT: std::cell::RefCell<std::collections::HashMap<u32, Instant>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// How long a failed copy marks its node as failing lately.
const FAILED_LATELY: Duration = Duration::from_secs(30);

fn failed_lately(node: u32) -> bool {
    FAILED_AT.with(|f| {
        f.borrow()
            .get(&node)
            .is_some_and(|t| t.elapsed() < FAILED_LATELY)
    })
}

fn note_failed(nodes: &[u32]) {
    FAILED_AT.with(|f| {
        let mut f = f.borrow_mut();
        // Bounded by the nodes in the map; old entries go.
        f.retain(|_, t| t.elapsed() < FAILED_LATELY);
        for &n in nodes {
            f.insert(n, Instant::now());
        }
    });
}

/// Counts a write of group `pg`, acknowledged under `map`, against each
/// of the group's other replicas without a confirmed copy: not up (so
/// not sent one), or `failed` (skipped: recorded in etcd). Shown as
/// `percore_cluster_replica_missed_writes` and `_replica_lag_seconds`
/// (`ShardMap::render_lag`) until a newer map shows the node caught up
/// (`caught_up`): a count of a node that caught up since starts again.
pub(crate) fn note_missed(
    metrics: &crate::metrics::ShardMetrics,
    map: &ShardMap,
    pg: u32,
    sent: &[&MapNode],
    failed: &[u32],
) {
    let mut missed = metrics.replica_missed.borrow_mut();
    let now = super::control::mono_ms();
    for n in map.replicas_of_pg(pg).filter(|&n| n != map.node_id) {
        if sent.iter().any(|s| s.id == n) && !failed.contains(&n) {
            continue;
        }
        let fresh = crate::metrics::Missed {
            writes: 0,
            since_ms: now,
            epoch: map.epoch,
        };
        let m = missed.entry(n).or_insert(fresh);
        if caught_up(map, n, m) {
            *m = fresh;
        }
        m.writes = m.writes.saturating_add(1);
        m.epoch = m.epoch.max(map.epoch);
    }
    // Bounded by the nodes in the map: those it no longer has go.
    if missed.len() > map.nodes.len() {
        missed.retain(|&n, _| map.node(n).is_some());
    }
}

/// Whether `map` says node `n` holds every write `m` counts, or they no
/// longer matter: it is up and synced in a map newer than the latest (a
/// synced node holds every acknowledged write of its groups), out or
/// draining (placed on no group: its groups' writes are on others), or
/// gone from the map.
fn caught_up(map: &ShardMap, n: u32, m: &crate::metrics::Missed) -> bool {
    map.node(n).is_none_or(|node| match node.state {
        NodeState::Up => node.synced && map.epoch > m.epoch,
        NodeState::Down => false,
        NodeState::Draining | NodeState::Out => true,
    })
}

/// Drops the counts of `note_missed` that `map` shows caught up: on each
/// map a shard takes (`Shard::start_map_feed`) and before a scrape.
pub fn prune_missed(metrics: &crate::metrics::ShardMetrics, map: &ShardMap) {
    metrics
        .replica_missed
        .borrow_mut()
        .retain(|&n, m| !caught_up(map, n, m));
}

/// This shard's writes acknowledged without a replica's confirmed copy,
/// as (node id, writes, oldest's `mono_ms`), once `map` pruned them.
pub fn missed_now(metrics: &crate::metrics::ShardMetrics, map: &ShardMap) -> Vec<(u32, u64, u64)> {
    prune_missed(metrics, map);
    metrics
        .replica_missed
        .borrow()
        .iter()
        .map(|(&n, m)| (n, m.writes, m.since_ms))
        .collect()
}

/// Records in etcd (through the control thread: `map::skip`) that a write
/// of group `pg` is acknowledged without `nodes`' copies; Err if it could
/// not be.
async fn skip(map: &ShardMap, pg: u32, nodes: Vec<u32>, deadline: Instant) -> Result<(), String> {
    use std::sync::atomic::{AtomicU8, Ordering};
    let names: Vec<String> = nodes
        .iter()
        .map(|&n| {
            map.node(n)
                .map_or_else(|| n.to_string(), |m| m.name.clone())
        })
        .collect();
    // Too late to be acknowledged: no mark for a write answered 503.
    if deadline.saturating_duration_since(Instant::now()) < SKIP_TIME_MIN {
        return Err(format!(
            "no time left to record that node(s) {} missed the write",
            names.join(", ")
        ));
    }
    // A node that may still lead the group under an older map may be
    // serving its reads: it must get every write (its map read is due
    // soon; then it leads no more).
    let now = super::control::mono_ms();
    if let Some(&n) = nodes.iter().find(|&&n| map.may_still_lead(pg, n, now)) {
        return Err(format!(
            "node {} may still lead this group under an older map, and missed the write",
            map.node(n)
                .map_or_else(|| n.to_string(), |m| m.name.clone())
        ));
    }
    let done = std::sync::Arc::new(AtomicU8::new(0));
    map.synced_tx
        .send(Report::Skip(SkipAsk {
            pg,
            epoch: map.epoch,
            until: deadline,
            nodes,
            done: done.clone(),
        }))
        .map_err(|_| "this node's control thread is gone".to_string())?;
    loop {
        match done.load(Ordering::Acquire) {
            0 if Instant::now() < deadline => glommio::timer::sleep(Duration::from_millis(2)).await,
            SKIP_DONE => return Ok(()),
            _ => {
                return Err(format!(
                    "cannot record in etcd that node(s) {} missed the write",
                    names.join(", ")
                ))
            }
        }
    }
}

/// After a write of `(bucket, key)` on its acting primary: copies the
/// key's state to the group's other replicas, and returns once the write
/// may be acknowledged (see the module documentation); Err: why not
/// (answer 503, retryable). A write a majority holds is acknowledged
/// without an up replica whose copy failed (down without its lease
/// expired yet, cut off, sick) once etcd recorded that (`skip`): that
/// replica then leads nothing before it caught up again.
pub async fn replicate(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    bucket: &str,
    key: &str,
) -> Result<(), String> {
    // A large version takes longer to copy (and a multipart one to hash):
    // its copies get time for its size at REPLICATE_RATE_MIN.
    let size = match ObjectSource::open(shard, bucket, key).await {
        Ok((_, meta)) => meta.size_bytes,
        Err(_) => 0,
    };
    let deadline = Instant::now() + REPLICATE_WAIT + Duration::from_secs(size / REPLICATE_RATE_MIN);
    loop {
        let Some(map) = shard.cluster_map() else {
            return Err("this node has no cluster map yet".into());
        };
        if map.primary_of(bucket, key) != map.node_id {
            // The map moved on: another node leads the key now, and its
            // replicas refuse this node's copies. The client's retry goes
            // to the new primary.
            return Err(format!(
                "this node no longer leads the key's placement group in map {}",
                map.epoch
            ));
        }
        let pg = map.pg_of(bucket, key);
        let others: Vec<&MapNode> = map
            .replicas_of_pg(pg)
            .filter(|&n| n != map.node_id)
            .filter_map(|n| map.node(n))
            .filter(|n| n.state == NodeState::Up)
            .collect();
        let results = push_all(shard, ckey, (&map, pg), &others, (bucket, key), deadline).await;
        let applied = applied_count(&map, pg, &others, &results);
        let mut why = Vec::new();
        let mut refused = false;
        let mut local = false;
        let mut failed = Vec::new();
        for (n, r) in others.iter().zip(&results) {
            match r {
                Pushed::Applied => {}
                Pushed::Local(m) => {
                    local = true;
                    why.push(m.clone());
                }
                Pushed::Refused(m) => {
                    refused = true;
                    why.push(format!("node {} refused the copy: {m}", n.name));
                }
                Pushed::Failed(m) => {
                    failed.push(n.id);
                    why.push(m.clone());
                }
            }
        }
        let metrics = shard.metrics();
        if !refused && !local && applied >= map.majority() {
            if !failed.is_empty() {
                note_failed(&failed);
                // Copied under a map that is no longer this node's: a node
                // that leads the group since may have missed it. Copied
                // again under the newer map instead.
                let moved = shard.cluster_map().is_some_and(|m| m.epoch != map.epoch);
                if moved && Instant::now() < deadline {
                    continue;
                }
                let skipped = if moved {
                    Err("the map moved on while the write was copied".to_string())
                } else {
                    skip(&map, pg, failed.clone(), deadline).await
                };
                if let Err(e) = skipped {
                    why.push(e);
                    crate::metrics::ShardMetrics::add(&metrics.cluster_replication_failed, 1);
                    return Err(why.join("; "));
                }
                crate::metrics::ShardMetrics::add(&metrics.cluster_replicas_skipped, 1);
            }
            // A node catching up read this key's shard under a newer map:
            // copy again under that map (it names the new replica).
            let fence = shard.key_fence(bucket, key, 0).await;
            if let Err(why) = super::control::may_lead(&map, Some(pg)) {
                // Cut off from etcd while copying: another node may lead
                // the key by now (and see no such write): not acknowledged.
                return Err(why.into());
            }
            if fence <= map.epoch {
                crate::metrics::ShardMetrics::add(&metrics.cluster_replicated, 1);
                note_missed(metrics, &map, pg, &others, &failed);
                return Ok(());
            }
            refused = true;
            why.push(format!(
                "a node caught up under map {fence}, newer than this node's {}",
                map.epoch
            ));
        } else if !refused && !local {
            why.push(format!(
                "{applied} of the group's {} replicas took the write (a majority, {}, must hold it)",
                map.replica_count,
                map.majority()
            ));
        }
        if refused && Instant::now() < deadline {
            newer_map(shard, map.epoch, deadline).await;
            if shard.cluster_map().is_some_and(|m| m.epoch > map.epoch) {
                continue;
            }
        }
        crate::metrics::ShardMetrics::add(&metrics.cluster_replication_failed, 1);
        return Err(why.join("; "));
    }
}

/// Whether a primary's own copy of a write in `pg` counts toward its
/// majority (1) or not (0): it does when the primary is one of the
/// group's replicas, or with R = 1 (a settled primary that is not one: its
/// copy is the group's data until the new holder is synced and filled),
/// and it is one of the group's settled replicas (`counts`; a primary
/// always is: `placement::acting_primary`).
fn own_count(map: &ShardMap, pg: u32) -> usize {
    usize::from((map.holds_pg(pg) || map.replica_count == 1) && counts(map, pg, map.node_id))
}

/// The copies of a write in group `pg` that count toward its majority:
/// this node's and those of `others` that `results` say took it.
fn applied_count(map: &ShardMap, pg: u32, others: &[&MapNode], results: &[Pushed]) -> usize {
    own_count(map, pg)
        + others
            .iter()
            .zip(results)
            .filter(|(n, r)| matches!(r, Pushed::Applied) && counts(map, pg, n.id))
            .count()
}

/// Whether node `id`'s copy of a write in group `pg` counts toward the
/// write's majority: it is one of the group's settled replicas (any node
/// while none is filled). A replica not recorded yet (a node added,
/// filling) takes copies but does not count: a write acknowledged on it
/// could be lost if the group moved off it before it was filled (the
/// settled replicas, which catch-ups merge, would not hold it). So every
/// acknowledged write is on a majority of the settled replicas.
/// Nor on a node recorded `empty` (`MapNode::empty`: on a data
/// directory other than the one its data is recorded on): that directory
/// may be swapped back for the recorded one, which lacks the copy.
fn counts(map: &ShardMap, pg: u32, id: u32) -> bool {
    if empty(map, id) {
        return false;
    }
    let mut settled = map.settled_of_pg(pg).peekable();
    settled.peek().is_none() || settled.any(|n| n == id)
}

/// A copy another node sent (`PUT /_percore/push`): refused (Err with
/// 409's message) when the sender is not the key's acting primary in this
/// node's map (unless the sender's map is newer), sent it under a map
/// older than this key shard's fence, or (this node on a replaced disk)
/// under a map from before this process joined.
pub async fn check_push(
    shard: &Rc<Shard>,
    map: &ShardMap,
    from: u32,
    bucket: &str,
    key: &str,
    state: &KeyState,
) -> Result<(), String> {
    if state.epoch > map.epoch.saturating_add(EPOCH_AHEAD_MAX) {
        return Err(format!(
            "sent under map {}, far ahead of this node's {}",
            state.epoch, map.epoch
        ));
    }
    if map.epoch >= state.epoch && map.primary_of(bucket, key) != from {
        return Err(format!(
            "node {from} is not this key's primary in map {} (this node's)",
            map.epoch
        ));
    }
    // On a replaced disk (`MapNode::empty`) its copies count toward no
    // write's majority, but a sender whose map is from before this node
    // joined may count one: refused, it reads a newer map and sends again
    // (or skips this node). Else a disk put back later could lack a write
    // counted on this one.
    if map.node(map.node_id).is_some_and(|n| n.empty) {
        let joined = super::control::STATUS.get().map_or(0, |s| {
            s.joined_epoch.load(std::sync::atomic::Ordering::Acquire)
        });
        if state.epoch < joined {
            return Err(format!(
                "sent under map {}, from before this node joined on a replaced disk (map {joined})",
                state.epoch
            ));
        }
    }
    // Taking a copy sent under a map raises this key shard's fence to it:
    // a copy from the key's previous primary, sent under an older map,
    // can no longer replace it.
    let fence = shard.key_fence(bucket, key, state.epoch).await;
    if state.epoch < fence {
        return Err(format!(
            "sent under map {}, older than map {fence} this key's shard took copies or a digest read under",
            state.epoch
        ));
    }
    Ok(())
}

/// The digest request's body.
#[derive(Debug, Deserialize)]
pub struct DigestRequest {
    pub epoch: u64,
    pub pgs: Option<Vec<u32>>,
    pub after: Option<(String, String)>,
    pub limit: usize,
    /// A catch-up that takes this node's state as the authority: answered
    /// only by a synced node that leads every group asked under a map at
    /// least as new as the reader's (`leads_for`).
    #[serde(default)]
    pub mirror: bool,
}

/// Whether this node may be mirrored by a reader at `epoch` for `pgs`: it
/// is synced and leads each of them in its own map, which is at least as
/// new as the reader's. A node that just gained groups is still synced in
/// the others' maps until it has marked itself unsynced, while its shards
/// keep the map before the change: it refuses to be mirrored meanwhile.
fn leads_for(map: &ShardMap, epoch: u64, pgs: &[u32]) -> Result<(), String> {
    if map.epoch < epoch {
        return Err(format!(
            "this node's map {} is older than the reader's {epoch}; retry",
            map.epoch
        ));
    }
    if !map.node(map.node_id).is_some_and(|n| n.synced) {
        return Err("this node is not synced; retry".into());
    }
    for &pg in pgs {
        super::control::may_lead(map, Some(pg))?;
    }
    if let Some(pg) = pgs.iter().find(|&&pg| map.primary_of_pg(pg) != map.node_id) {
        return Err(format!("this node does not lead group {pg}; retry"));
    }
    Ok(())
}

/// `leads_for` of a fetch (`mirror=1&epoch=E`) for one key.
pub fn check_fetch(map: &ShardMap, epoch: u64, bucket: &str, key: &str) -> Result<(), String> {
    leads_for(map, epoch, &[map.pg_of(bucket, key)])
}

/// Answers `POST /_percore/digest`.
pub async fn answer_digest(
    shard: &Rc<Shard>,
    map: &ShardMap,
    body: &[u8],
) -> Result<Value, String> {
    let req: DigestRequest =
        serde_json::from_slice(body).map_err(|e| format!("bad digest request: {e}"))?;
    // A reader far ahead of this node's map would fence its shards for
    // good (a forged or broken peer): this node reads the map first.
    if req.epoch > map.epoch.saturating_add(EPOCH_AHEAD_MAX) {
        return Err(format!(
            "the reader's map {} is far ahead of this node's {}; retry",
            req.epoch, map.epoch
        ));
    }
    let pgs = match req.pgs {
        Some(mut pgs) => {
            if pgs.iter().any(|&p| p >= map.pgs) {
                return Err("bad digest request: no such placement group".into());
            }
            pgs.sort_unstable();
            pgs.dedup();
            Some(pgs)
        }
        None => None,
    };
    if req.mirror {
        leads_for(map, req.epoch, pgs.as_deref().unwrap_or_default())?;
    }
    let (items, next) = shard
        .digest(req.after, req.limit, pgs, req.epoch)
        .await
        .map_err(|e| format!("{e:?}"))?;
    let items: Vec<Value> = items
        .into_iter()
        .map(|i| json!([i.bucket, i.key, i.stamp, i.etag]))
        .collect();
    Ok(json!({"items": items, "next": next.map(|(b, k)| json!([b, k]))}))
}

/// A node that turns unsynced this soon after it synced is flapping.
const FLAP_WINDOW: Duration = Duration::from_secs(60);
/// The longest hold-down before a flapping node syncs again.
const HOLD_DOWN_MAX: Duration = Duration::from_secs(60);

/// How long a node that turned unsynced soon after syncing, `flaps` times
/// in a row, waits before it syncs again: none the first time (one skip
/// is no flap), then 2 s, 4 s, .. up to `HOLD_DOWN_MAX`, each between
/// half and all of that (two nodes cut from each other, both unsynced and
/// both syncing, would otherwise skip each other in lockstep).
fn hold_down(flaps: u32) -> Duration {
    if flaps <= 1 {
        return Duration::ZERO;
    }
    let full = Duration::from_secs(1u64 << (flaps - 1).min(6)).min(HOLD_DOWN_MAX);
    full.mul_f64(0.5 + rand::random::<f64>() / 2.0)
}

/// Keeps a node that is not synced (it joined, or came back) catching up
/// until it is: on shard 0 of every cluster node. Each pass takes every
/// placement group this node holds from the group's acting primary, then
/// tells the control thread, which marks the node synced in etcd if the
/// map has not changed since.
pub fn start_catch_up(shard: Rc<Shard>, ckey: [u8; 32]) {
    glommio::spawn_local(async move {
        // (epoch, skipped revision) reported, and when.
        let mut reported = ((0, 0), Instant::now());
        // Since when this node is synced, as its map says.
        let mut synced_since: Option<Instant> = None;
        // Times in a row it turned unsynced within FLAP_WINDOW of syncing
        // (skipped again, say by a node it reaches only one way), and
        // until when it does not sync again.
        let mut flaps = 0u32;
        let mut hold_until: Option<Instant> = None;
        loop {
            glommio::timer::sleep(CATCH_UP_EVERY).await;
            let Some(map) = shard.cluster_map() else {
                continue;
            };
            let Some(me) = map.node(map.node_id) else {
                continue;
            };
            if me.synced {
                let since = *synced_since.get_or_insert_with(Instant::now);
                if since.elapsed() > FLAP_WINDOW {
                    flaps = 0;
                }
                continue;
            }
            if let Some(since) = synced_since.take() {
                if since.elapsed() < FLAP_WINDOW {
                    flaps += 1;
                    hold_until = Some(Instant::now() + hold_down(flaps));
                } else {
                    flaps = 0;
                }
            }
            // Reported under this map: the control thread marks the node
            // synced; reported again if that did not happen for a while
            // (an etcd error).
            if me.state != NodeState::Up
                || hold_until.is_some_and(|t| Instant::now() < t)
                || (reported.0 == (map.epoch, map.skipped) && reported.1.elapsed() < REPORT_AGAIN)
            {
                continue;
            }
            let started = Instant::now();
            match catch_up(&shard, &ckey, &map).await {
                Ok((fetched, dropped)) => {
                    tracing::info!(
                        epoch = map.epoch,
                        fetched,
                        dropped,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "cluster: caught up"
                    );
                    let report = Report::Synced {
                        epoch: map.epoch,
                        skipped: map.skipped,
                    };
                    if map.synced_tx.send(report).is_ok() {
                        reported = ((map.epoch, map.skipped), Instant::now());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cluster: catching up failed; retrying"),
            }
        }
    })
    .detach();
}

/// One catch-up pass under `map`: (versions and tombstones taken, own
/// versions dropped). A group whose acting primary is synced is taken
/// from it as it is (mirror: what this node holds that the primary does
/// not is dropped). A group with no synced replica up (a new cluster, or
/// one whose replicas all went down) has no authority: it is merged from
/// every other up replica (each key's newest version), needing a
/// majority of the group's replicas: every acknowledged write is on a
/// majority, and nothing is dropped.
async fn catch_up(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    map: &ShardMap,
) -> Result<(u64, u64), String> {
    // The cluster's buckets first (the catalog in etcd, applied by this
    // shard as the control thread reads it): a node caught up serves them.
    if !super::catalog::ready() {
        return Err("the cluster's buckets are not read from etcd yet".into());
    }
    // Not worth a pass while a leading peer cannot be reached.
    reach_peers(map).await?;
    let sources = sources_of(map)?;
    let (mut taken, mut dropped) = (0, 0);
    let pace = Pace::new();
    let progress = Progress::start(map.pgs, &sources);
    let steps = sources.into_iter().flat_map(|(from, pgs)| {
        pgs.chunks(GROUPS_PER_PASS)
            .map(|c| (from, c.to_vec()))
            .collect::<Vec<_>>()
    });
    for ((p, mirror), pgs) in steps {
        let node = map
            .node(p)
            .ok_or_else(|| format!("node {p} is not in the map"))?;
        let addr = node
            .s3
            .ok_or_else(|| format!("node {} has no usable S3 address", node.name))?;
        let mut theirs: HashSet<(String, String)> = HashSet::new();
        let mut after: Option<(String, String)> = None;
        loop {
            let (items, next) =
                remote_digest(ckey, map, (node, mirror, map.epoch), &pgs, after).await?;
            for ((b, k), (stamp, etag)) in items {
                let mine = shard
                    .key_state(&b, &k)
                    .await
                    .map_err(|e| format!("{e:?}"))?
                    .map(|(s, e, marker)| {
                        (
                            s,
                            if marker {
                                Some(crate::store::MARKER_DIGEST_ETAG.to_string())
                            } else {
                                e
                            },
                        )
                    });
                let wanted = match &mine {
                    None => true,
                    Some((s, e)) if mirror => *s != stamp || *e != etag,
                    // A tombstone stamped as the version it dropped (a
                    // copy a node gave up: `drop_copies`, repairs) does
                    // not hide that version from a merge.
                    Some((s, e)) => *s < stamp || (*s == stamp && e.is_none() && etag.is_some()),
                };
                let from = Source {
                    node,
                    addr,
                    mirror,
                    pace: &pace,
                };
                if wanted && take_from(shard, ckey, map, &from, &b, &k, mine.map(|m| m.0)).await? {
                    taken += 1;
                }
                theirs.insert((b, k));
            }
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        if mirror {
            let from = Source {
                node,
                addr,
                mirror,
                pace: &pace,
            };
            dropped += drop_unknown(shard, ckey, map, &from, &pgs, &theirs).await?;
        }
        progress.took(&pgs);
    }
    reach_peers(map).await?;
    Ok((taken, dropped))
}

/// Peers probed at once by `reach_peers`.
const REACH_IN_FLIGHT: usize = 32;

/// Ok if this node can open a connection to every synced up node it
/// shares a placement group with (those lead, and would skip it). A node
/// does not report itself synced before it can: cut off from one of
/// them (while both still reach etcd), it would skip that node's copies,
/// or be skipped by it, at once again (`replicate`). Unsynced until the
/// cut heals, it leads nothing and takes its copies from the primaries it
/// reaches. An unsynced node it cannot reach does not hold it back (that
/// one leads nothing; two unsynced nodes cut from each other that both
/// sync take turns at being skipped, which `start_catch_up`'s hold-down
/// breaks).
async fn reach_peers(map: &ShardMap) -> Result<(), String> {
    let peers: std::collections::BTreeSet<u32> = (0..map.pgs)
        .filter(|&pg| map.holds_pg(pg))
        .flat_map(|pg| map.replicas_of_pg(pg))
        .filter(|&n| n != map.node_id)
        .collect();
    let nodes: Vec<&MapNode> = peers
        .iter()
        .filter_map(|&n| map.node(n))
        .filter(|n| n.state == NodeState::Up && n.synced)
        .collect();
    for chunk in nodes.chunks(REACH_IN_FLIGHT) {
        let tries = chunk.iter().map(|n| async move {
            let Some(addr) = n.s3 else {
                return Err(format!("node {} has no usable S3 address", n.name));
            };
            peer_http::open(addr).await.map(drop).map_err(|e| {
                format!(
                    "cannot reach node {}, a replica of groups this node holds ({e}); it stays unsynced until it can",
                    n.name
                )
            })
        });
        for r in futures::future::join_all(tries).await {
            r?;
        }
    }
    Ok(())
}

/// Where a catch-up pass under `map` takes each group this node holds:
/// (source node, mirror) -> groups (see `catch_up`).
fn sources_of(map: &ShardMap) -> Result<BTreeMap<(u32, bool), Vec<u32>>, String> {
    let mut sources: BTreeMap<(u32, bool), Vec<u32>> = BTreeMap::new();
    for pg in (0..map.pgs).filter(|&pg| map.holds_pg(pg)) {
        let p = map.primary_of_pg(pg);
        if p != map.node_id && map.node(p).is_some_and(|n| n.synced) {
            sources.entry((p, true)).or_default().push(pg);
            continue;
        }
        // Merging needs a majority of the group's replicas (this one
        // included): every acknowledged write is on a majority, and any
        // two majorities share a replica.
        let up: Vec<u32> = map
            .replicas_of_pg(pg)
            .filter(|&r| r != map.node_id && map.node(r).is_some_and(|n| n.state == NodeState::Up))
            .collect();
        if up.len() + 1 < map.majority() {
            return Err(format!(
                "group {pg} has no synced replica up and too few replicas up to merge from ({} of {}); waiting for more to return",
                up.len() + 1,
                map.replica_count
            ));
        }
        // A replica on a data directory its data is not recorded on
        // (`MapNode::empty`: a replaced disk) lacks the writes
        // acknowledged before: the others merged from must meet every
        // majority of the group's replicas without it.
        let placed = map.replicas_of_pg(pg).count();
        let full =
            up.iter().filter(|&&r| !empty(map, r)).count() + usize::from(!empty(map, map.node_id));
        if full < meets_every_majority(placed, map.majority()) {
            return Err(format!(
                "group {pg} has no synced replica up, and too few of its replicas up that are not on a replaced (empty) disk to merge from ({full} of {placed}); waiting for more to return"
            ));
        }
        for &r in &up {
            sources.entry((r, false)).or_default().push(pg);
        }
        // The group's settled replicas (`placement::settled_replicas`, a
        // record of the hand-off: where its acknowledged writes were before the
        // placement moved) need not be its replicas: with R = 1 the only
        // holder is its settled primary, the node that held it; with
        // more, the replicas may all be new (nodes added at once) and a
        // majority of them holds only the writes made since. A majority
        // of the settled replicas is merged from too (this node counts if
        // it is one), and waited for while too few are up or draining:
        // the group merged without them would sync without its keys.
        let holders: Vec<&MapNode> = map
            .settled_of_pg(pg)
            .filter_map(|id| map.node(id))
            .collect();
        // Up ones first; a draining one only if the majority needs it (it
        // may be stopped: it stays draining in the map).
        let need = holders.len() / 2 + 1;
        // Counted, and counted not empty (the empty ones are merged from
        // too: they hold the writes made since they joined).
        let (mut have, mut full) = (0, 0);
        let full_need = meets_every_majority(holders.len(), need);
        let mut missing = Vec::new();
        for state in [NodeState::Up, NodeState::Draining] {
            for s in holders.iter().filter(|s| s.state == state) {
                if s.id == map.node_id {
                    have += 1;
                    full += usize::from(!s.empty);
                } else if state == NodeState::Up || have < need || full < full_need {
                    have += 1;
                    full += usize::from(!s.empty);
                    if !up.contains(&s.id) {
                        sources.entry((s.id, false)).or_default().push(pg);
                    }
                }
            }
        }
        for s in holders
            .iter()
            .filter(|s| !matches!(s.state, NodeState::Up | NodeState::Draining))
        {
            if s.id == map.node_id {
                have += 1;
                full += usize::from(!s.empty);
            } else {
                missing.push(format!("{} ({})", s.name, s.state.name()));
            }
        }
        if !holders.is_empty() && (have < need || full < full_need) {
            let empties: Vec<&str> = holders
                .iter()
                .filter(|s| s.empty && matches!(s.state, NodeState::Up | NodeState::Draining))
                .map(|s| s.name.as_str())
                .collect();
            let mut why = Vec::new();
            if !missing.is_empty() {
                why.push(format!("{} not up", missing.join(", ")));
            }
            if !empties.is_empty() {
                why.push(format!(
                    "{} on a replaced (empty) disk (`percore cluster status`: empty=yes)",
                    empties.join(", ")
                ));
            }
            return Err(format!(
                "group {pg}'s keys are on nodes that cannot be merged from ({}): waiting for them to return (or to be removed)",
                why.join("; ")
            ));
        }
    }
    Ok(sources)
}

/// Whether node `id` runs on a data directory its data is not recorded
/// on (`MapNode::empty`: a replaced disk, until it syncs).
fn empty(map: &ShardMap, id: u32) -> bool {
    map.node(id).is_some_and(|n| n.empty)
}

/// How many of `placed` replicas a merge must read so that it meets
/// every `majority` of them (each acknowledged write is on one).
fn meets_every_majority(placed: usize, majority: usize) -> usize {
    placed.saturating_sub(majority) + 1
}

/// A running catch-up pass's progress, on `/metrics`:
/// `percore_cluster_backfill_groups_left` (groups times their sources
/// still to take) and, per group, its sources still to take
/// (`ClusterStatus::backfill_sources_left`). Both go back to 0 when the
/// pass ends, also on an error.
struct Progress {
    left: std::cell::Cell<u64>,
}

impl Progress {
    fn start(pgs: u32, sources: &BTreeMap<(u32, bool), Vec<u32>>) -> Progress {
        use std::sync::atomic::Ordering::Relaxed;
        let left = sources.values().map(|pgs| pgs.len() as u64).sum::<u64>();
        if let Some(s) = super::control::STATUS.get() {
            s.backfill_groups_left.store(left, Relaxed);
            let per_group = s.backfill_sources_sized(pgs);
            for pg in sources.values().flatten() {
                if let Some(n) = per_group.get(*pg as usize) {
                    n.fetch_add(1, Relaxed);
                }
            }
        }
        Progress {
            left: std::cell::Cell::new(left),
        }
    }

    /// One source's `pgs` were taken.
    fn took(&self, pgs: &[u32]) {
        use std::sync::atomic::Ordering::Relaxed;
        self.left
            .set(self.left.get().saturating_sub(pgs.len() as u64));
        if let Some(s) = super::control::STATUS.get() {
            s.backfill_groups_left.store(self.left.get(), Relaxed);
            let per_group = s.backfill_sources_left();
            for pg in pgs {
                if let Some(n) = per_group.get(*pg as usize) {
                    let _ = n.fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1));
                }
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(s) = super::control::STATUS.get() {
            s.backfill_groups_left.store(0, Relaxed);
            for n in s.backfill_sources_left() {
                n.store(0, Relaxed);
            }
        }
    }
}

/// Paces a catch-up's fetched bytes to the node's backfill rate
/// (`cluster_backfill_mib_s`; 0: not bounded): a token bucket holding at
/// most one second of the rate, on the catching-up shard alone.
struct Pace {
    tokens: std::cell::Cell<f64>,
    last: std::cell::Cell<Instant>,
}

impl Pace {
    fn new() -> Pace {
        Pace {
            tokens: std::cell::Cell::new(0.0),
            last: std::cell::Cell::new(Instant::now()),
        }
    }

    /// `n` bytes were taken: counted, and waited for past the rate.
    async fn took(&self, n: usize) {
        let Some(s) = super::control::STATUS.get() else {
            return;
        };
        s.backfill_bytes
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        let rate = s
            .backfill_bytes_s
            .load(std::sync::atomic::Ordering::Relaxed) as f64;
        if rate <= 0.0 {
            return;
        }
        let now = Instant::now();
        let refill = now.duration_since(self.last.get()).as_secs_f64() * rate;
        self.last.set(now);
        let tokens = (self.tokens.get() + refill).min(rate) - n as f64;
        self.tokens.set(tokens);
        if tokens < 0.0 {
            glommio::timer::sleep(Duration::from_secs_f64(-tokens / rate)).await;
        }
    }
}

/// Where a catch-up takes keys from: a synced primary (`mirror`: its
/// state replaces this node's) or another replica (only newer versions).
struct Source<'a> {
    node: &'a MapNode,
    addr: SocketAddr,
    mirror: bool,
    pace: &'a Pace,
}

/// Versions here, in `pgs`, that the primary's digest did not hold
/// (`theirs`): writes it never acknowledged, or deletes whose tombstones
/// it dropped. Each is asked of the primary again (its digest may have
/// passed the key before it was written and copied here) and dropped only
/// if it holds nothing. Returns the number dropped.
async fn drop_unknown(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    map: &ShardMap,
    from: &Source<'_>,
    pgs: &[u32],
    theirs: &HashSet<(String, String)>,
) -> Result<u64, String> {
    let mut dropped = 0;
    let mut after = None;
    loop {
        let (items, next) = shard
            .digest(after, DIGEST_PAGE, Some(pgs.to_vec()), 0)
            .await
            .map_err(|e| format!("{e:?}"))?;
        for i in items {
            if i.etag.is_none() || theirs.contains(&(i.bucket.clone(), i.key.clone())) {
                continue;
            }
            if take_from(shard, ckey, map, from, &i.bucket, &i.key, Some(i.stamp)).await? {
                dropped += 1;
            }
        }
        match next {
            Some(n) => after = Some(n),
            None => return Ok(dropped),
        }
    }
}

/// Takes `from`'s state of one key over this node's (stamped `mine`):
/// Ok(true) if it was installed (or, mirroring, this node's version
/// dropped because `from` holds nothing).
async fn take_from(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    map: &ShardMap,
    from: &Source<'_>,
    bucket: &str,
    key: &str,
    mine: Option<u64>,
) -> Result<bool, String> {
    let (node, addr) = (from.node, from.addr);
    let mut target = format!("/_percore/fetch?bucket={}&key={}", enc(bucket), enc(key));
    if from.mirror {
        target.push_str(&format!("&mirror=1&epoch={}", map.epoch));
    }
    let mac = sign(
        ckey,
        map,
        node.id,
        "GET",
        &target,
        &peer_http::body_hash(b""),
    );
    let fail = |e: String| format!("fetching {bucket}/{key} from node {}: {e}", node.name);
    let mut r = peer_http::get(addr, &target, &mac)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let covered = match r.status {
        404 => FETCH_ABSENT.to_string(),
        200 => fetch_covered(r.header(STATE_HEADER).unwrap_or_default()),
        s => return Err(fail(format!("status {s}"))),
    };
    peer_http::verify_reply(
        ckey,
        &mac,
        r.status,
        &covered,
        r.header(peer_http::REPLY_HEADER),
    )
    .map_err(|e| fail(e.to_string()))?;
    if r.status == 404 {
        // The primary holds nothing for the key (deleted and its
        // tombstone compacted, or never acknowledged): neither may this
        // node, unless a copy came meanwhile (the stamp it holds moved).
        // Another replica's absence says nothing.
        return match mine {
            Some(m) if from.mirror => shard
                .delete_stamped(
                    bucket,
                    key,
                    PutCondition::Replace {
                        seen: Some(m),
                        stamp: m,
                    },
                    u64::MAX,
                )
                .await
                .map_err(|e| fail(format!("{e:?}"))),
            _ => Ok(false),
        };
    }
    let (_, state) = KeyState::decode(r.header(STATE_HEADER).unwrap_or_default()).map_err(fail)?;
    if r.content_length() != Some(if state.etag.is_some() { state.size } else { 0 }) {
        return Err(fail("the answer's length is not the state's".into()));
    }
    // Older than what is here: an unacknowledged write of this node's, or
    // a copy pushed since the digest (then it stays).
    // Or, merging, at the stamp of a tombstone here (`catch_up` asks only
    // for a version the tombstone replaced).
    let condition = match mine {
        Some(m) if (from.mirror && m >= state.stamp) || m == state.stamp => PutCondition::Replace {
            seen: Some(m),
            stamp: state.stamp,
        },
        _ => PutCondition::IfNewer(state.stamp),
    };
    let size = state.size;
    let mut applier = match Applier::open(shard, bucket, key, state, condition)
        .await
        .map_err(|e| fail(format!("{e:?}")))?
    {
        Ok(a) => a,
        Err(done) => return Ok(done == Applied::Installed),
    };
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    while got < size {
        let n = r.read(&mut buf).await.map_err(|e| fail(e.to_string()))?;
        if n == 0 {
            return Err(fail("the answer was cut short".into()));
        }
        let n = n.min(usize::try_from(size - got).unwrap_or(usize::MAX));
        got += n as u64;
        applier
            .feed(Bytes::copy_from_slice(&buf[..n]))
            .await
            .map_err(|e| fail(format!("{e:?}")))?;
        from.pace.took(n).await;
    }
    let done = applier.finish().await.map_err(|e| fail(format!("{e:?}")))?;
    Ok(done == Applied::Installed)
}

/// How long a node asked to release groups waits for its own map to
/// reach the asker's before it answers 503.
const RELEASE_WAIT: Duration = Duration::from_secs(2);
/// How often shard 0 asks a node for groups it still waits for.
const RELEASE_AGAIN: Duration = Duration::from_millis(500);

/// Why a release was not answered.
#[derive(Debug)]
pub enum ReleaseRefused {
    /// The request is malformed (400).
    Bad(String),
    /// Not now: retry (503).
    Busy(String),
}

/// Answers `POST /_percore/release` (`{"epoch":E}`): this node's control
/// thread reads the map (unless its shards hold E or newer) and lets it
/// lead under no map older than the newest; answered once that is at
/// least E.
pub async fn answer_release(map: &ShardMap, body: &[u8]) -> Result<Value, ReleaseRefused> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        epoch: u64,
    }
    let req: Req = serde_json::from_slice(body)
        .map_err(|e| ReleaseRefused::Bad(format!("bad release request: {e}")))?;
    if req.epoch > map.epoch.saturating_add(EPOCH_AHEAD_MAX) {
        return Err(ReleaseRefused::Busy(format!(
            "epoch {} is too far ahead of this node's map {}",
            req.epoch, map.epoch
        )));
    }
    let Some(status) = super::control::STATUS.get() else {
        return Err(ReleaseRefused::Busy(
            "this node has no control thread".into(),
        ));
    };
    let reached = || status.lead_epoch.load(std::sync::atomic::Ordering::Acquire) >= req.epoch;
    if !reached() {
        map.synced_tx
            .send(Report::Release(req.epoch))
            .map_err(|_| ReleaseRefused::Busy("this node's control thread stopped".into()))?;
        let deadline = Instant::now() + RELEASE_WAIT;
        while !reached() {
            if Instant::now() >= deadline {
                return Err(ReleaseRefused::Busy(format!(
                    "this node could not read a map as new as {} in time",
                    req.epoch
                )));
            }
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(json!({ "released": req.epoch }))
}

/// How many release requests shard 0 has in flight at most.
const RELEASES_IN_FLIGHT: usize = 32;

/// On shard 0 of every cluster node: while the map makes this node wait to
/// lead groups that other nodes, still up, may lead under an older map,
/// asks each of them to release (`answer_release`), all at once; once one
/// answers, the waits for it end (`ShardMap::released`). A node that cannot
/// be reached (cut off) is waited out, without holding up the others.
pub fn start_releases(shard: Rc<Shard>, ckey: [u8; 32]) {
    glommio::spawn_local(async move {
        // (epoch, node) -> when it last answered (None: asked, no answer yet).
        type Asked = BTreeMap<(u64, u32), Option<Instant>>;
        let asked: Rc<std::cell::RefCell<Asked>> = Rc::default();
        let in_flight = Rc::new(std::cell::Cell::new(0usize));
        loop {
            glommio::timer::sleep(Duration::from_millis(20)).await;
            let Some(map) = shard.cluster_map() else {
                continue;
            };
            let pending = map.pending_takeovers(super::control::mono_ms());
            asked.borrow_mut().retain(|(e, _), _| *e == map.epoch);
            for from in pending {
                if in_flight.get() >= RELEASES_IN_FLIGHT {
                    break;
                }
                if asked
                    .borrow()
                    .get(&(map.epoch, from))
                    .is_some_and(|t| t.is_none_or(|t| t.elapsed() < RELEASE_AGAIN))
                {
                    continue;
                }
                asked.borrow_mut().insert((map.epoch, from), None);
                if map.node(from).is_none() {
                    continue;
                }
                in_flight.set(in_flight.get() + 1);
                let (map, asked, in_flight) = (map.clone(), asked.clone(), in_flight.clone());
                glommio::spawn_local(async move {
                    let node = map.node(from).expect("checked above");
                    let answer = crate::frontend::http::timeout::within(
                        RELEASE_WAIT + Duration::from_secs(1),
                        ask_release(&ckey, &map, node),
                    )
                    .await;
                    in_flight.set(in_flight.get() - 1);
                    if let Some(t) = asked.borrow_mut().get_mut(&(map.epoch, from)) {
                        *t = Some(Instant::now());
                    }
                    match answer {
                        Some(Ok(())) => {
                            map.released(from, map.epoch);
                            tracing::info!(
                                epoch = map.epoch,
                                from = %node.name,
                                "cluster: node released; leading the groups it held up"
                            );
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, from = %node.name, "cluster: release refused; waiting");
                        }
                        None => {
                            tracing::debug!(from = %node.name, "cluster: release not answered; waiting");
                        }
                    }
                })
                .detach();
            }
        }
    })
    .detach();
}

/// A node-authenticated `POST target` of a JSON `body` to `node`: its
/// status and answer (at most `answer_max` bytes).
pub(crate) async fn post_signed(
    ckey: &[u8; 32],
    map: &ShardMap,
    node: &MapNode,
    target: &str,
    body: &Value,
    answer_max: usize,
) -> Result<(u16, Vec<u8>), String> {
    let addr = node
        .s3
        .ok_or_else(|| format!("node {} has no usable S3 address", node.name))?;
    let body = serde_json::to_vec(body).expect("serializable");
    let mac = sign(
        ckey,
        map,
        node.id,
        "POST",
        target,
        &peer_http::body_hash(&body),
    );
    peer_http::call(ckey, addr, "POST", target, &mac, &body, answer_max)
        .await
        .map_err(|e| e.to_string())
}

async fn ask_release(ckey: &[u8; 32], map: &ShardMap, node: &MapNode) -> Result<(), String> {
    let body = json!({ "epoch": map.epoch });
    let (status, answer) = post_signed(ckey, map, node, "/_percore/release", &body, 4096).await?;
    let v: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    if status == 200 && v["released"].as_u64() == Some(map.epoch) {
        Ok(())
    } else {
        Err(format!("{status} {}", String::from_utf8_lossy(&answer)))
    }
}

/// Keeps a synced node's replicas in agreement with it for the groups it
/// leads: on shard 0 of every cluster node. Whenever this node starts to
/// lead groups (it joined and caught up, or a primary failed and it is the
/// next replica), it compares its digest of those groups with each other
/// up replica's and copies its own state over theirs where they differ
/// (`PutCondition::Replace`: only over the version its digest saw, so a
/// newer copy is never undone). What a replica holds that this node does
/// not was never acknowledged (a synced node holds every acknowledged
/// write of its groups: it took each one, or was skipped and then caught
/// up again from a synced primary): it is dropped, by a tombstone with
/// its own stamp.
pub fn start_repair(shard: Rc<Shard>, ckey: [u8; 32]) {
    glommio::spawn_local(async move {
        let mut repaired: HashSet<u32> = HashSet::new();
        loop {
            glommio::timer::sleep(CATCH_UP_EVERY).await;
            let Some(map) = shard.cluster_map() else {
                continue;
            };
            let Some(me) = map.node(map.node_id) else {
                continue;
            };
            if !me.synced
                || me.state != NodeState::Up
                || super::control::may_lead(&map, None).is_err()
            {
                repaired.clear();
                continue;
            }
            let led: HashSet<u32> = (0..map.pgs)
                .filter(|&pg| map.primary_of_pg(pg) == map.node_id)
                .collect();
            repaired.retain(|pg| led.contains(pg));
            let mut todo: Vec<u32> = led.difference(&repaired).copied().collect();
            if todo.is_empty() {
                continue;
            }
            todo.sort_unstable();
            let started = Instant::now();
            let mut result = Ok(0);
            // A few groups at a time: each pass holds their digests.
            for batch in todo.chunks(GROUPS_PER_PASS) {
                match repair(&shard, &ckey, &map, batch).await {
                    Ok(n) => {
                        result = result.map(|f| f + n);
                        repaired.extend(batch.iter().copied());
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            match result {
                Ok(fixed) => {
                    tracing::info!(
                        epoch = map.epoch,
                        groups = todo.len(),
                        fixed,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "cluster: replicas of the groups this node now leads agree with it"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cluster: repairing replicas failed; retrying")
                }
            }
        }
    })
    .detach();
}

/// How often shard 0 looks for copies of groups this node gave up.
const DROP_EVERY: Duration = Duration::from_secs(2);
/// How often it looks again under a map it looked under already (copies
/// sent to it late, by a primary on an older map).
const DROP_AGAIN: Duration = Duration::from_secs(600);
/// A pause between two pages of drops: they are writes (tombstones), in
/// the background.
const DROP_PAUSE: Duration = Duration::from_millis(20);

/// The groups whose copies this node drops under `map`: it neither holds
/// nor leads them, nor is one of their settled replicas, and they are
/// whole elsewhere: R replicas placed, each up and synced (each holds
/// every acknowledged write), one of them the acting primary.
fn given_up(map: &ShardMap) -> Vec<u32> {
    let whole = |pg: u32| {
        let primary = map.primary_of_pg(pg);
        let mut n = 0;
        for r in map.replicas_of_pg(pg) {
            if !map
                .node(r)
                .is_some_and(|n| n.state == NodeState::Up && n.synced)
            {
                return false;
            }
            n += 1;
        }
        n == map.replica_count && map.replicas_of_pg(pg).any(|r| r == primary)
    };
    // Nor copies of a group this node is a settled replica of: the
    // hand-off is not recorded yet (`handoff`), and the record says the
    // group's data is here.
    (0..map.pgs)
        .filter(|&pg| !map.holds_pg(pg) && map.primary_of_pg(pg) != map.node_id && whole(pg))
        .filter(|&pg| !map.settled_of_pg(pg).any(|n| n == map.node_id))
        .collect()
}

/// Drops this node's live copies of keys of groups it gave up (`given_up`:
/// a node added took them, or they moved when a node drained or left) so
/// that their space is freed and a bucket emptied through the doors can
/// be deleted. A copy is dropped only if the group's acting primary holds
/// that version or a newer write of the key (its digest says so), and the
/// key's shard took no copy under a newer map (its fence): a placement
/// that went wrong leaves copies stranded here, never lost. Each is
/// dropped by a tombstone stamped as the version it drops
/// (`PutCondition::Replace`: a copy that arrived meanwhile stays), which
/// hides nothing from a merge (`catch_up`). Only on a node up or draining
/// whose lease and map are confirmed, under a map it has held for a
/// takeover wait, and again under the same map only after `DROP_AGAIN`.
/// (Whether this node is synced does not matter: the groups it drops are
/// whole on other nodes.)
pub fn start_drop_copies(shard: Rc<Shard>, ckey: [u8; 32]) {
    glommio::spawn_local(async move {
        let mut seen: Option<(u64, Instant)> = None;
        let mut done: Option<(u64, Instant)> = None;
        loop {
            glommio::timer::sleep(DROP_EVERY).await;
            let Some(map) = shard.cluster_map() else {
                continue;
            };
            let Some(me) = map.node(map.node_id) else {
                continue;
            };
            if seen.is_none_or(|(e, _)| e != map.epoch) {
                seen = Some((map.epoch, Instant::now()));
            }
            let longest = map.nodes.iter().map(|n| n.ttl_ms).max().unwrap_or(0);
            let settle = Duration::from_millis(super::control::takeover_wait_ms(if longest > 0 {
                longest
            } else {
                10_000
            }));
            if !matches!(me.state, NodeState::Up | NodeState::Draining)
                || !super::control::confirmed(&map)
                || seen.is_some_and(|(_, at)| at.elapsed() < settle)
                || done.is_some_and(|(e, at)| e == map.epoch && at.elapsed() < DROP_AGAIN)
            {
                continue;
            }
            let pgs = given_up(&map);
            if pgs.is_empty() {
                set_stranded(0);
            } else {
                match drop_copies(&shard, &ckey, &map, pgs).await {
                    Ok((0, 0)) => set_stranded(0),
                    Ok((dropped, stranded)) => {
                        set_stranded(stranded);
                        tracing::info!(
                        epoch = map.epoch,
                        dropped,
                        stranded,
                        "cluster: dropped copies of keys of placement groups this node no longer holds (their replicas all hold them); copies their primary does not hold are kept (stranded)"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cluster: dropping copies of groups this node gave up failed; retrying");
                        continue;
                    }
                }
            }
            done = Some((map.epoch, Instant::now()));
        }
    })
    .detach();
}

/// Most live copies one pass of `start_drop_copies` collects before it
/// checks and drops them (the rest: next pass).
const DROP_BATCH: usize = 100_000;

/// `percore_cluster_copies_stranded`.
fn set_stranded(n: u64) {
    if let Some(s) = super::control::STATUS.get() {
        s.copies_stranded
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One pass of `start_drop_copies` over `pgs` under `map`: (copies
/// dropped, copies kept because the primary does not hold them or
/// something newer). One walk over this node's keys of `pgs` collects its
/// live copies (at most `DROP_BATCH`); each group that has some is then
/// checked against its acting primary's digest, a few groups at a time
/// (read without raising the primary's fences: a drop needs none). Stops
/// (Err) when the map changes or this node's lease or map is no longer
/// confirmed.
async fn drop_copies(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    map: &ShardMap,
    pgs: Vec<u32>,
) -> Result<(u64, u64), String> {
    // Group -> its live copies here.
    let mut live: BTreeMap<u32, Vec<(String, String, u64, String)>> = BTreeMap::new();
    let mut count = 0;
    let mut after = None;
    'walk: loop {
        let (items, next) = shard
            .digest(after, DIGEST_PAGE, Some(pgs.clone()), 0)
            .await
            .map_err(|e| format!("{e:?}"))?;
        for i in items {
            if let Some(etag) = i.etag {
                let pg = map.pg_of(&i.bucket, &i.key);
                live.entry(pg)
                    .or_default()
                    .push((i.bucket, i.key, i.stamp, etag));
                count += 1;
                if count >= DROP_BATCH {
                    break 'walk;
                }
            }
        }
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let mut by_primary: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &pg in live.keys() {
        by_primary
            .entry(map.primary_of_pg(pg))
            .or_default()
            .push(pg);
    }
    let (mut dropped, mut stranded) = (0, 0);
    for (p, pgs) in by_primary {
        let primary = map
            .node(p)
            .ok_or_else(|| format!("node {p} is not in the map"))?;
        for chunk in pgs.chunks(GROUPS_PER_PASS) {
            let theirs = digest_of(ckey, map, primary, chunk).await?;
            for (b, k, stamp, etag) in chunk.iter().flat_map(|pg| live.remove(pg)).flatten() {
                let held = theirs.get(&(b.clone(), k.clone())).is_some_and(|(s, e)| {
                    *s > stamp || (*s == stamp && e.as_deref() == Some(etag.as_str()))
                });
                if !held {
                    stranded += 1;
                    continue;
                }
                if shard.cluster_map().is_none_or(|m| m.epoch != map.epoch)
                    || !super::control::confirmed(map)
                {
                    return Err("the map changed, or is not confirmed; looking again".into());
                }
                // Not if the key's shard took a copy or answered a digest
                // under a newer map (this node is the key's replica, or a
                // catch-up's source, again there): checked in the same
                // turn of that shard as the drop.
                let condition = PutCondition::Replace {
                    seen: Some(stamp),
                    stamp,
                };
                match shard.delete_stamped(&b, &k, condition, map.epoch).await {
                    Ok(true) => {
                        dropped += 1;
                        crate::metrics::ShardMetrics::add(
                            &shard.metrics().cluster_copies_dropped,
                            1,
                        );
                    }
                    // A copy came meanwhile: it stays (until the next pass).
                    Ok(false)
                    | Err(ShardError::PreconditionFailed | ShardError::ConditionalConflict) => {}
                    Err(e) => return Err(format!("dropping {b}/{k}: {e:?}")),
                }
            }
            glommio::timer::sleep(DROP_PAUSE).await;
        }
    }
    Ok((dropped, stranded))
}

/// `node`'s whole digest of `pgs`, read without raising its fences
/// (epoch 0).
async fn digest_of(
    ckey: &[u8; 32],
    map: &ShardMap,
    node: &MapNode,
    pgs: &[u32],
) -> Result<BTreeMap<(String, String), (u64, Option<String>)>, String> {
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let (items, next) = remote_digest(ckey, map, (node, false, 0), pgs, after).await?;
        out.extend(items);
        match next {
            Some(n) => after = Some(n),
            None => return Ok(out),
        }
    }
}

/// Every (bucket, key) -> (stamp, ETag) of a digest of `pgs`, here
/// (`node` None) or on `node`.
async fn full_digest(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    map: &ShardMap,
    node: Option<&MapNode>,
    pgs: &[u32],
) -> Result<BTreeMap<(String, String), (u64, Option<String>)>, String> {
    let mut out = BTreeMap::new();
    let mut after: Option<(String, String)> = None;
    loop {
        let (items, next) = match node {
            None => {
                let (items, next) = shard
                    .digest(after.clone(), DIGEST_PAGE, Some(pgs.to_vec()), 0)
                    .await
                    .map_err(|e| format!("{e:?}"))?;
                let items = items
                    .into_iter()
                    .map(|i| ((i.bucket, i.key), (i.stamp, i.etag)))
                    .collect::<Vec<_>>();
                (items, next)
            }
            Some(node) => {
                remote_digest(ckey, map, (node, false, map.epoch), pgs, after.clone()).await?
            }
        };
        out.extend(items);
        match next {
            Some(n) => after = Some(n),
            None => return Ok(out),
        }
    }
}

type DigestPage = (
    Vec<((String, String), (u64, Option<String>))>,
    Option<(String, String)>,
);

/// One page of `node`'s digest of `pgs`, raising its fences to `epoch`
/// (this node's map's; 0: not raised).
async fn remote_digest(
    ckey: &[u8; 32],
    map: &ShardMap,
    (node, mirror, epoch): (&MapNode, bool, u64),
    pgs: &[u32],
    after: Option<(String, String)>,
) -> Result<DigestPage, String> {
    let body = json!({
        "epoch": epoch,
        "pgs": pgs,
        "after": after.as_ref().map(|(b, k)| json!([b, k])),
        "limit": DIGEST_PAGE,
        "mirror": mirror,
    });
    let (status, answer) = post_signed(
        ckey,
        map,
        node,
        "/_percore/digest",
        &body,
        DIGEST_ANSWER_MAX,
    )
    .await
    .map_err(|e| format!("digest from node {}: {e}", node.name))?;
    if status != 200 {
        return Err(format!(
            "digest from node {}: {status} {}",
            node.name,
            String::from_utf8_lossy(&answer)
        ));
    }
    let v: Value = serde_json::from_slice(&answer)
        .map_err(|e| format!("digest from node {}: {e}", node.name))?;
    let mut items = Vec::new();
    for item in v["items"].as_array().into_iter().flatten() {
        let (Some(b), Some(k), Some(stamp)) =
            (item[0].as_str(), item[1].as_str(), item[2].as_u64())
        else {
            return Err(format!("digest from node {}: bad item", node.name));
        };
        items.push((
            (b.to_string(), k.to_string()),
            (stamp, item[3].as_str().map(str::to_string)),
        ));
    }
    let next = match &v["next"] {
        Value::Null => None,
        n => match (n[0].as_str(), n[1].as_str()) {
            (Some(b), Some(k)) => Some((b.to_string(), k.to_string())),
            _ => return Err(format!("digest from node {}: bad next", node.name)),
        },
    };
    if let (Some(a), Some(n)) = (&after, &next) {
        if n <= a {
            return Err(format!(
                "digest from node {}: next does not move on",
                node.name
            ));
        }
    }
    Ok((items, next))
}

/// One repair of `pgs` (groups this node leads): the number of keys whose
/// state it copied over a replica's.
async fn repair(
    shard: &Rc<Shard>,
    ckey: &[u8; 32],
    map: &ShardMap,
    pgs: &[u32],
) -> Result<u64, String> {
    let mut peers: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &pg in pgs {
        for n in map.replicas_of_pg(pg) {
            if n != map.node_id && map.node(n).is_some_and(|n| n.state == NodeState::Up) {
                peers.entry(n).or_default().push(pg);
            }
        }
    }
    let mut fixed = 0;
    let mut failed: Option<String> = None;
    for (peer, pgs) in peers {
        let node = map.node(peer).expect("in the map");
        let addr = node
            .s3
            .ok_or_else(|| format!("node {} has no usable S3 address", node.name))?;
        let theirs = full_digest(shard, ckey, map, Some(node), &pgs).await?;
        let mine = full_digest(shard, ckey, map, None, &pgs).await?;
        let keys: std::collections::BTreeSet<&(String, String)> =
            theirs.keys().chain(mine.keys()).collect();
        for bk in keys {
            let (b, k) = (bk.0.as_str(), bk.1.as_str());
            let (t, m) = (theirs.get(bk), mine.get(bk));
            if t == m || (t.is_none() && m.is_some_and(|m| m.1.is_none())) {
                continue;
            }
            let seen = t.map(|t| t.0);
            let (state, src) = match local_state(shard, b, k, map.epoch)
                .await
                .map_err(|e| format!("reading {b}/{k}: {e:?}"))?
            {
                Some(s) => s,
                // Nothing here: theirs was never acknowledged.
                None => (KeyState::tombstone(map.epoch, seen.unwrap_or(0)), None),
            };
            // A key that cannot be repaired does not hold up the others;
            // the pass fails (and runs again) at its end.
            match send_push(
                shard,
                ckey,
                map,
                peer,
                addr,
                (b, k),
                &state,
                src,
                Some(seen),
            )
            .await
            {
                Ok((200, _)) => fixed += 1,
                Ok((status, body)) => {
                    failed.get_or_insert(format!(
                        "repairing {b}/{k} on node {}: {status} {}",
                        node.name,
                        String::from_utf8_lossy(&body)
                    ));
                }
                Err(e) => {
                    failed.get_or_insert(format!("repairing {b}/{k} on node {}: {e}", node.name));
                }
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(fixed),
    }
}
