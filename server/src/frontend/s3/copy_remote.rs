//! CopyObject and UploadPartCopy from a source another cluster node
//! leads (docs/cluster.md, "S3 on a cluster"). The copy runs on the
//! destination key's primary, which reads the source from the source
//! key's primary over `GET /_percore/object` (authenticated by the node
//! MAC like every internal request; the requesting node checked the
//! client's permission to read the source):
//!
//! ```text
//! GET /_percore/object?bucket=B&key=K&version=V
//!     answer: JSON {etag, size, mtime_ms, content_type, headers,
//!     version_id}, signed as internal answers are (`x-percore-reply`)
//! GET /_percore/object?bucket=B&key=K&version=V&etag=E&from=A&len=N
//!     answer: the N bytes from offset A of that version (refused if its
//!     ETag is not E), then 64 hex digits: HMAC-SHA256(cluster key,
//!     "percore-object-v1\n" hex(request MAC) "\n" bytes)
//! ```
//!
//! V is empty (the current version), "null" or a version id; the second
//! request names the version the first one found (its id, or its ETag in
//! a bucket never versioned), so both read the same object. The trailing
//! MAC binds the bytes to the request: the copy is finished (made
//! visible) only once it verified, so bytes altered or cut on the way are
//! never stored.

use bytes::Bytes;
use hmac::Mac;
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use super::checksum;
use super::cluster::Peer;
use super::{Conn, S3Front};
use crate::cluster::peer_http;
use crate::cluster::replicate::enc;
use crate::cluster::shardmap::ShardMap;
use crate::frontend::http::ResponseHead;
use crate::frontend::s3::error::S3Error;
use crate::shard::object::{ObjectSink, ObjectSource};
use crate::store::record::ObjectMeta;
use crate::store::versions::Pick;

/// Bytes read and written at a time.
const CHUNK_BYTES: u64 = 1 << 20;

/// What the source's primary says of the version it serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RemoteMeta {
    etag: String,
    size: u64,
    mtime_ms: u64,
    content_type: String,
    headers: Vec<(String, String)>,
    version_id: Option<String>,
}

/// A copy source on another node: its version pinned by the first read.
pub(super) struct RemoteSource {
    peer: Peer,
    map: std::sync::Arc<ShardMap>,
    bucket: String,
    key: String,
    /// `version=` of the byte reads.
    version: String,
    etag: String,
}

/// `version=`'s value for `pick`.
fn version_param(pick: Pick) -> String {
    match pick {
        Pick::Current => String::new(),
        Pick::Null => "null".into(),
        Pick::Id(id) => crate::store::versions::version_id(Some(id)),
    }
}

/// A peer's answer that did not serve the copy source: 503 (retry).
/// Its own reasons (no such key, version or bucket; a delete marker) come
/// in a signed answer (`SourceError`): an unsigned error may be from a
/// node that does not know the request (an older version) or forged.
fn peer_error(peer: &Peer, status: u16, body: &[u8]) -> S3Error {
    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
    S3Error::new(
        503,
        "ServiceUnavailable",
        format!(
            "cluster node {} did not serve the copy source ({status}: {text}); retry",
            peer.name
        ),
    )
}

/// Why the source's primary does not serve it, in its signed answer.
#[derive(Debug, Serialize, Deserialize)]
struct SourceError {
    status: u16,
    code: String,
    message: String,
}

/// The source errors a node passes on as they are (others: 503).
fn source_error(e: &SourceError) -> Option<S3Error> {
    matches!(
        (e.status, e.code.as_str()),
        (404, "NoSuchKey" | "NoSuchVersion" | "NoSuchBucket") | (405, "MethodNotAllowed")
    )
    .then(|| {
        S3Error::new(
            e.status,
            super::cluster::static_code(&e.code),
            e.message.clone(),
        )
    })
}

impl S3Front {
    /// The node that leads the copy source `(bucket, key)`, when it is
    /// not this one (None on a single node).
    pub(super) fn remote_owner(&self, bucket: &str, key: &str) -> Result<Option<Peer>, S3Error> {
        let Some(map) = self.map()? else {
            return Ok(None);
        };
        let owner = map.primary_of(bucket, key);
        if owner == map.node_id {
            // Read here only while this node may serve the source's
            // group (as a GET of it).
            super::cluster::lead_check(&map, Some(map.pg_of(bucket, key)))?;
            return Ok(None);
        }
        let node = map.node(owner).ok_or_else(|| {
            S3Error::new(
                503,
                "ServiceUnavailable",
                "No node holds the copy source's placement group (are any nodes up?); retry.",
            )
        })?;
        super::cluster::peer_of(node).map(Some)
    }

    /// Opens a copy source on `peer`: its metadata, its version id, and
    /// the pinned source to read its bytes from.
    pub(super) async fn open_remote(
        &self,
        peer: Peer,
        (bucket, key, pick): (&str, &str, Pick),
    ) -> Result<(RemoteSource, ObjectMeta, Option<String>), S3Error> {
        let map = self
            .map()?
            .ok_or_else(|| S3Error::internal("a copy from another node on a single node"))?;
        let target = format!(
            "/_percore/object?bucket={}&key={}&version={}",
            enc(bucket),
            enc(key),
            enc(&version_param(pick))
        );
        let (status, body) = self.peer_get(&map, &peer, &target).await?;
        if status != 200 {
            return Err(peer_error(&peer, status, &body));
        }
        if let Ok(e) = serde_json::from_slice::<SourceError>(&body) {
            return Err(source_error(&e).unwrap_or_else(|| peer_error(&peer, e.status, &body)));
        }
        let m: RemoteMeta = serde_json::from_slice(&body).map_err(|e| {
            S3Error::new(
                503,
                "ServiceUnavailable",
                format!(
                    "cluster node {} answered a bad copy source: {e}; retry",
                    peer.name
                ),
            )
        })?;
        let meta = ObjectMeta {
            size_bytes: m.size,
            etag: m.etag.clone(),
            mtime_ms: m.mtime_ms,
            content_type: m.content_type,
            headers: m.headers,
        };
        let version = match &m.version_id {
            Some(v) => v.clone(),
            None => version_param(pick),
        };
        let source = RemoteSource {
            peer,
            map,
            bucket: bucket.to_string(),
            key: key.to_string(),
            version,
            etag: m.etag,
        };
        Ok((source, meta, m.version_id))
    }

    /// Streams `len` bytes of `source` from `start` into `sink`, hashing
    /// them with MD5 (returned, hex) and `checksum`; Err if the bytes do
    /// not end with their MAC (the sink is then dropped unfinished).
    pub(super) async fn copy_remote_bytes(
        &self,
        source: &RemoteSource,
        sink: &mut ObjectSink,
        (start, len): (u64, u64),
        mut checksum: Option<&mut checksum::Hasher>,
    ) -> Result<String, S3Error> {
        let peer = &source.peer;
        let fail = |what: String| {
            S3Error::new(
                503,
                "ServiceUnavailable",
                format!(
                    "reading the copy source from cluster node {}: {what}; retry",
                    peer.name
                ),
            )
        };
        let target = format!(
            "/_percore/object?bucket={}&key={}&version={}&etag={}&from={start}&len={len}",
            enc(&source.bucket),
            enc(&source.key),
            enc(&source.version),
            enc(&source.etag)
        );
        let node_header = self.sign(
            &source.map,
            peer.id,
            "GET",
            &target,
            &peer_http::body_hash(b""),
        );
        let request = peer_http::request_mac(&node_header).expect("a header this node made");
        let mut r = peer_http::get(peer.addr, &target, &node_header)
            .await
            .map_err(|e| fail(e.to_string()))?;
        if r.status != 200 {
            let status = r.status;
            let body = r.body(64 * 1024).await.unwrap_or_default();
            return Err(peer_error(peer, status, &body));
        }
        let framed = len + peer_http::OBJECT_MAC_HEX as u64;
        if r.is_chunked() || r.content_length() != Some(framed) {
            return Err(fail(format!(
                "an answer of {:?} bytes for {len} and their MAC",
                r.content_length()
            )));
        }
        let mut mac = peer_http::object_mac(&self.cluster_key(), &request);
        let mut md5 = Md5::new();
        let mut buf = vec![0u8; CHUNK_BYTES as usize];
        let mut left = len;
        while left > 0 {
            // A whole chunk (or the rest) per write to the sink.
            let want = left.min(CHUNK_BYTES) as usize;
            let mut filled = 0;
            while filled < want {
                let n = r
                    .read(&mut buf[filled..want])
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                if n == 0 {
                    return Err(fail(format!(
                        "the answer ended {} bytes short",
                        left - filled as u64
                    )));
                }
                filled += n;
            }
            let chunk = &buf[..want];
            mac.update(chunk);
            md5.update(chunk);
            if let Some(h) = checksum.as_deref_mut() {
                h.update(chunk);
            }
            sink.write(Bytes::copy_from_slice(chunk)).await?;
            left -= want as u64;
        }
        let mut tag = [0u8; peer_http::OBJECT_MAC_HEX];
        let mut got = 0;
        while got < tag.len() {
            let n = r
                .read(&mut tag[got..])
                .await
                .map_err(|e| fail(e.to_string()))?;
            if n == 0 {
                return Err(fail("the answer ended before its MAC".into()));
            }
            got += n;
        }
        let want = hex::encode(mac.finalize().into_bytes());
        if !bool::from(want.as_bytes().ct_eq(&tag)) {
            return Err(fail("its bytes do not match their MAC".into()));
        }
        Ok(hex::encode(md5.finalize()))
    }

    /// `GET /_percore/object` (the module docs): a copy source this node
    /// leads, for the node that copies it.
    pub(super) async fn answer_object(
        &self,
        conn: &mut Conn,
        map: &ShardMap,
        q: &dyn Fn(&str) -> String,
        request: &[u8; 32],
    ) -> Result<(), S3Error> {
        let (bucket, key) = (q("bucket"), q("key"));
        // A client's key (not a version's index key) of a client's bucket.
        if !crate::frontend::common::valid_bucket_name(&bucket)
            || key.is_empty()
            || key.len() > 1024
            || key.contains('\0')
        {
            return Err(S3Error::invalid_argument("Invalid key"));
        }
        if !crate::cluster::catalog::may_source() {
            return Err(S3Error::new(
                503,
                "SlowDown",
                "This node has not applied the cluster's buckets since it started, or is dropping a deleted bucket's keys; retry.",
            ));
        }
        super::cluster::lead_check(map, Some(map.pg_of(&bucket, &key)))?;
        if map.primary_of(&bucket, &key) != map.node_id {
            return Err(S3Error::new(
                503,
                "SlowDown",
                "This node does not lead the copy source's placement group in its map (the map is changing); retry.",
            ));
        }
        let pick = match q("version").as_str() {
            "" => Pick::Current,
            v => Pick::parse(v).ok_or_else(|| S3Error::invalid_argument("bad version"))?,
        };
        let (from, len) = (q("from"), q("len"));
        let head = from.is_empty() && len.is_empty();
        let opened = if self.shard.bucket_exists(&bucket) {
            ObjectSource::open_version(&self.shard, &bucket, &key, pick).await
        } else {
            Err(crate::shard::msg::ShardError::NoSuchBucket)
        };
        let (mut src, meta, version_id) = match opened {
            Ok(o) => o,
            // Why not, signed (`SourceError`), for the metadata read.
            Err(e) if head => {
                let e = S3Error::from(e);
                if e.status >= 500 {
                    return Err(e);
                }
                let body = serde_json::to_string(&SourceError {
                    status: e.status,
                    code: e.code.to_string(),
                    message: e.message,
                })
                .map_err(|e| S3Error::internal(e.to_string()))?;
                return self.answer_signed(conn, request, &body, true).await;
            }
            Err(e) => return Err(e.into()),
        };
        if head {
            let m = RemoteMeta {
                etag: meta.etag.clone(),
                size: meta.size_bytes,
                mtime_ms: meta.mtime_ms,
                content_type: meta.content_type.clone(),
                headers: meta.headers.clone(),
                version_id,
            };
            let body = serde_json::to_string(&m).map_err(|e| S3Error::internal(e.to_string()))?;
            return self.answer_signed(conn, request, &body, true).await;
        }
        let bad = || S3Error::invalid_argument("bad range");
        let (from, len): (u64, u64) = (
            from.parse().map_err(|_| bad())?,
            len.parse().map_err(|_| bad())?,
        );
        if from
            .checked_add(len)
            .is_none_or(|end| end > meta.size_bytes)
        {
            return Err(bad());
        }
        if q("etag") != meta.etag {
            return Err(S3Error::new(
                503,
                "SlowDown",
                "The copy source changed while it was copied; retry.",
            ));
        }
        self.stream_object(conn, &mut src, (from, len), request)
            .await
    }

    /// The bytes of an object read (`answer_object`), then their MAC.
    async fn stream_object(
        &self,
        conn: &mut Conn,
        src: &mut ObjectSource,
        (from, len): (u64, u64),
        request: &[u8; 32],
    ) -> Result<(), S3Error> {
        let mut mac = peer_http::object_mac(&self.cluster_key(), request);
        let head = ResponseHead::new(200).with_header("Content-Type", "application/octet-stream");
        conn.write_response(&head, len + peer_http::OBJECT_MAC_HEX as u64, true)
            .await?;
        let end = from + len;
        let mut at = from;
        while at < end {
            let want = (end - at).min(CHUNK_BYTES);
            let chunk = src.read(at, want).await?;
            if chunk.is_empty() || chunk.len() as u64 > want {
                // The head is out: closing short tells the reader.
                return Err(S3Error::internal("copy source shorter than its metadata"));
            }
            mac.update(&chunk[..]);
            conn.write_body(&chunk[..]).await?;
            at += chunk.len() as u64;
        }
        conn.write_body(hex::encode(mac.finalize().into_bytes()).as_bytes())
            .await?;
        Ok(conn.flush().await?)
    }
}
