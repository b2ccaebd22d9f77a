//! The S3 door's side of replication (`cluster::replicate`): a write this
//! node ordered as its key's primary is copied to the other replicas
//! before its answer goes out (`respond` calls `replicate_write`), and the
//! copies and fetches other nodes send are served here.

use bytes::{Bytes, BytesMut};
use serde_json::json;

use super::route::S3Op;
use super::{Conn, Request, S3Front};
use crate::cluster::peer_http;
use crate::cluster::replicate::{
    self, fetch_covered, Applied, Applier, KeyState, FETCH_ABSENT, STATE_HEADER,
};
use crate::cluster::shardmap::ShardMap;
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::error::S3Error;
use crate::metrics::ShardMetrics;
use crate::shard::msg::ShardError;
use crate::store::PutCondition;

/// Operations whose success changes their key's state (copied to the
/// key's other replicas before they are answered).
fn changes_key(op: S3Op) -> bool {
    matches!(
        op,
        S3Op::PutObject
            | S3Op::CopyObject
            | S3Op::DeleteObject
            | S3Op::CompleteMultipartUpload
            | S3Op::PutObjectTagging
            | S3Op::DeleteObjectTagging
            | S3Op::PutObjectAcl
    )
}

/// A copy of a version or delete marker whose id is a stamp a day or
/// more ahead of this node's clock (as `valid_state` bounds stamps) is
/// refused: such an id would lift every later id of the key
/// (`Store::next_stamp` ignores them, but the version would sort first).
/// Ids below `STAMP_ID_MIN` are seqs (older versions); a tombstone at any
/// id is taken (it removes, and lifts nothing).
fn valid_version_id(key: &str, state: &KeyState) -> Result<(), S3Error> {
    use crate::store::versions::{split_version_key, STAMP_ID_MIN};
    let day_ms = 24 * 3600 * 1000;
    let ahead = split_version_key(key)
        .is_some_and(|(_, id)| id >= STAMP_ID_MIN && id > crate::store::now_ms() + day_ms);
    if ahead && (state.etag.is_some() || state.marker) {
        return Err(S3Error::invalid_argument(
            "a version id far ahead of this node's clock",
        ));
    }
    Ok(())
}

fn refused(message: String) -> S3Error {
    S3Error::new(409, "Conflict", message)
}

/// Copies and fetches are of client keys and their real versions only
/// (never of bucket, user, configuration or upload records).
fn valid_key(bucket: &str, key: &str) -> Result<(), S3Error> {
    let plain = crate::store::versions::base_key(key);
    if bucket.is_empty()
        || bucket.len() > 63
        || plain.len() > 1024
        || !crate::store::is_replicated_key(bucket, key)
    {
        return Err(S3Error::invalid_argument("Invalid key"));
    }
    Ok(())
}

/// A copy's state must be one percore could have stored: header names
/// lower-case tokens, no control characters in any value (they are sent
/// back to clients), a stamp not far ahead of this node's clock.
fn valid_state(state: &KeyState) -> Result<(), S3Error> {
    // Tabs are allowed in header values; other control characters are not.
    let bad = |s: &str| s.chars().any(|c| c.is_control() && c != '\t');
    // HTTP token characters (RFC 9110), lower-case as stored.
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
            })
    };
    let day_ms = 24 * 3600 * 1000;
    if state.headers.len() > crate::store::record::HEADERS_COUNT_MAX
        || state.headers.iter().any(|(n, v)| !name_ok(n) || bad(v))
        || bad(&state.content_type)
        || state.etag.as_deref().is_some_and(bad)
        || state.stamp > crate::store::now_ms().saturating_add(day_ms)
    {
        return Err(S3Error::invalid_argument("bad copy state"));
    }
    Ok(())
}

/// `mirror=1&epoch=E` of a fetch: a catch-up that takes this node's
/// state as the authority, reading under map E.
pub(super) fn mirror_epoch(req: &Request) -> Result<Option<u64>, S3Error> {
    match req.q("mirror") {
        Some("1") => req
            .q("epoch")
            .unwrap_or_default()
            .parse()
            .map(Some)
            .map_err(|_| S3Error::invalid_argument("bad epoch")),
        _ => Ok(None),
    }
}

/// A replica's own busy answer (another copy of the key in progress).
fn busy(e: ShardError) -> S3Error {
    match e {
        ShardError::ConditionalConflict => S3Error::new(
            503,
            "SlowDown",
            "Another copy of this key is being stored; retry.",
        ),
        e => e.into(),
    }
}

impl S3Front {
    /// Before a successful answer to a request that changed a key on a
    /// cluster node: the state of what it changed (the version its answer
    /// names) copied to the key's other replicas (Err: 503, the write is
    /// not acknowledged).
    pub(super) async fn replicate_write(
        &self,
        req: &Request,
        head: &ResponseHead,
    ) -> Result<(), S3Error> {
        if !self.shard.is_cluster() || !(200..300).contains(&head.status) || !changes_key(req.op) {
            return Ok(());
        }
        let version = head
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("x-amz-version-id"))
            .map(|(_, v)| v.as_str());
        self.replicate_key(&req.bucket, &replicate::index_key_of(&req.key, version))
            .await
    }

    /// Copies `(bucket, key)`'s state to its other replicas.
    pub(super) async fn replicate_key(&self, bucket: &str, key: &str) -> Result<(), S3Error> {
        replicate::replicate(&self.shard, &self.cluster_key(), bucket, key)
            .await
            .map_err(|why| {
                S3Error::new(
                    503,
                    "ServiceUnavailable",
                    format!("The write is stored on this node but its replicas did not all take it, so it is not acknowledged ({why}); retry."),
                )
            })
    }

    /// `PUT /_percore/push`: a copy of a key's state from its primary.
    pub(super) async fn receive_push(
        &self,
        conn: &mut Conn,
        req: &Request,
        map: &ShardMap,
        (from, request): (u32, &[u8; 32]),
        state: KeyState,
    ) -> Result<(), S3Error> {
        let (bucket, key) = (
            req.q("bucket").unwrap_or_default().to_string(),
            req.q("key").unwrap_or_default().to_string(),
        );
        valid_key(&bucket, &key)?;
        valid_state(&state)?;
        valid_version_id(&key, &state)?;
        let m = self.shard.metrics();
        if let Err(why) = replicate::check_push(&self.shard, map, from, &bucket, &key, &state).await
        {
            ShardMetrics::add(&m.cluster_copies_refused, 1);
            return Err(refused(why));
        }
        let epoch = state.epoch;
        let size = state.size;
        // A repair names the version it replaces (`seen`).
        let condition = match req.q("seen") {
            None => PutCondition::IfNewer(state.stamp),
            Some("none") => PutCondition::Replace {
                seen: None,
                stamp: state.stamp,
            },
            Some(s) => PutCondition::Replace {
                seen: Some(
                    s.parse()
                        .map_err(|_| S3Error::invalid_argument("bad seen stamp"))?,
                ),
                stamp: state.stamp,
            },
        };
        let done = match Applier::open(&self.shard, &bucket, &key, state, condition)
            .await
            .map_err(busy)?
        {
            Err(done) => done,
            Ok(mut applier) => {
                let mut got = 0u64;
                let mut input = BytesMut::new();
                loop {
                    // Room for the rest of the copy, at most 1 MiB: a small
                    // copy zeroes a buffer of its size, not of 1 MiB.
                    let left = usize::try_from(size.saturating_sub(got)).unwrap_or(usize::MAX);
                    if input.len() < left.clamp(1, 64 * 1024) {
                        input = BytesMut::zeroed(left.clamp(4096, 1 << 20));
                    }
                    let n = conn.read_body(&mut input[..]).await?;
                    if n == 0 {
                        break;
                    }
                    got += n as u64;
                    if got > size {
                        ShardMetrics::add(&m.cluster_copies_refused, 1);
                        return Err(S3Error::invalid_argument(
                            "the copy is longer than its state",
                        ));
                    }
                    let data: Bytes = input.split_to(n).freeze();
                    applier.feed(data).await?;
                }
                match applier.finish().await {
                    Ok(done) => done,
                    Err(ShardError::ConditionalConflict) => {
                        return Err(busy(ShardError::ConditionalConflict))
                    }
                    Err(e) => {
                        ShardMetrics::add(&m.cluster_copies_refused, 1);
                        return Err(e.into());
                    }
                }
            }
        };
        // A catch-up read this key's shard while the copy was stored: it
        // may not have seen it, so the copy does not count.
        let fence = self.shard.key_fence(&bucket, &key, 0).await;
        if epoch < fence {
            ShardMetrics::add(&m.cluster_copies_refused, 1);
            return Err(refused(format!(
                "a node caught up under map {fence} while the copy was stored"
            )));
        }
        if done == Applied::Installed {
            ShardMetrics::add(&m.cluster_copies_taken, 1);
        }
        // What this replica holds now: the primary checks it is its own.
        let (stamp, etag, marker) = match self.shard.key_state(&bucket, &key).await? {
            Some((s, e, m)) => (Some(s), e, m),
            None => (None, None, false),
        };
        let body = json!({"applied": done == Applied::Installed, "stamp": stamp, "etag": etag, "marker": marker})
            .to_string();
        // The primary keeps the connection for its next copy to this node
        // unless it asked to close, or the copy's bytes were not read (this
        // node held the version already): the connection closes then.
        let close = !req.head.keep_alive() || !conn.body_finished();
        self.answer_signed(conn, request, &body, close).await
    }

    /// `GET /_percore/fetch`: this node's state of a key and its bytes (a
    /// node catching up).
    pub(super) async fn answer_fetch(
        &self,
        conn: &mut Conn,
        map: &ShardMap,
        (bucket, key): (&str, &str),
        req_epoch: Option<u64>,
        request: &[u8; 32],
    ) -> Result<(), S3Error> {
        valid_key(bucket, key)?;
        // A catch-up that mirrors this node: only while it leads the key.
        if let Some(epoch) = req_epoch {
            replicate::check_fetch(map, epoch, bucket, key)
                .map_err(|e| S3Error::new(503, "SlowDown", e))?;
        }
        let Some((state, src)) =
            replicate::local_state(&self.shard, bucket, key, map.epoch).await?
        else {
            // Signed: a mirroring catch-up drops its own copy on it.
            let tag = peer_http::sign_reply(&self.cluster_key(), request, 404, FETCH_ABSENT);
            let head = ResponseHead::new(404).with_header(peer_http::REPLY_HEADER, tag);
            conn.write_response(&head, 0, true).await?;
            return Ok(conn.flush().await?);
        };
        let size = if state.etag.is_some() { state.size } else { 0 };
        let (_, value) = state.encode();
        let tag = peer_http::sign_reply(&self.cluster_key(), request, 200, &fetch_covered(&value));
        let head = ResponseHead::new(200)
            .with_header(STATE_HEADER, value)
            .with_header(peer_http::REPLY_HEADER, tag);
        conn.write_response(&head, size, true).await?;
        if let Some(mut src) = src {
            let mut at = 0;
            while at < size {
                let n = (1u64 << 20).min(size - at);
                // Shorter at a part's or extent's end.
                let chunk = src.read(at, n).await?;
                if chunk.is_empty() {
                    // The head is out: closing short tells the reader.
                    return Err(S3Error::internal("object shorter than its metadata"));
                }
                conn.write_body(&chunk[..]).await?;
                at += chunk.len() as u64;
            }
        }
        Ok(conn.flush().await?)
    }
}
