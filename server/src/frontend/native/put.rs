//! Put: a streamed upload. The connection's reader hands the Put's payload
//! and its PutData frames to one task per upload (`conn`), which checks the
//! declared size and CRC32C, regroups the bytes into store pieces
//! (`datapath::PieceBuilder`) and makes the object visible only once all
//! of it arrived and verified. An upload whose client stops sending is
//! aborted after `put_data_timeout`.

use futures::channel::mpsc;
use futures::StreamExt;
use percore_protocol::native::{self as proto, Reply, Status};

use super::conn::PutFrame;
use super::{status_of, NativeFront};
use crate::frontend::common::PUT_BYTES_MAX;
use crate::frontend::datapath::PieceBuilder;
use crate::frontend::http::within;
use crate::shard::object::ObjectSink;
use crate::store::record::ObjectMeta;
use crate::store::ObjectInfo;

/// What an upload has received so far.
struct Received {
    /// CRC32C of the bytes received.
    crc: u32,
    total_bytes: u64,
    /// The CRC32C the client declared, in the Put or in a PutData.
    declared_crc: Option<u32>,
    pieces: PieceBuilder,
}

/// A failed upload's Reply: `status` and `message`, naming the owner.
fn failed(owner_shard: i32, status: Status, message: impl Into<String>) -> Reply {
    Reply {
        owner_shard,
        ..Reply::error(status, message)
    }
}

impl NativeFront {
    /// Runs one upload to its Reply: the object's size, ETag and CRC32C, or
    /// why nothing was stored.
    pub(super) async fn put(
        &self,
        id: u64,
        p: proto::PutRequest,
        mut data: mpsc::Receiver<PutFrame>,
        principal: crate::access::Principal,
    ) -> Reply {
        let owner = self.shard.owner_of(&p.bucket, &p.key) as i32;
        if let Some(refusal) = self.refusal(&principal, &proto::Request::Put(p.clone())) {
            return Reply {
                owner_shard: owner,
                ..refusal
            };
        }
        if p.size > PUT_BYTES_MAX {
            let m = format!(
                "object of {} bytes exceeds the limit of {PUT_BYTES_MAX}",
                p.size
            );
            return failed(owner, Status::TooLarge, m);
        }
        let meta = ObjectMeta {
            size_bytes: 0,
            etag: String::new(),
            mtime_ms: 0,
            content_type: if p.content_type.is_empty() {
                "binary/octet-stream".into()
            } else {
                p.content_type.clone()
            },
            headers: Vec::new(),
        };
        let mut sink = match ObjectSink::open(&self.shard, &p.bucket, &p.key, meta).await {
            Ok(s) => s,
            Err(e) => {
                let (s, m) = status_of(&e);
                return failed(owner, s, m);
            }
        };
        let mut got = Received {
            crc: 0,
            total_bytes: 0,
            declared_crc: p.crc32c,
            pieces: PieceBuilder::new(self.shard.md5_engine()),
        };
        if let Err((s, m)) = self
            .put_receive(id, &p, &mut sink, &mut data, &mut got)
            .await
        {
            // Dropping `sink` aborts the upload; dropping `data` returns
            // the budget of frames still queued.
            return failed(owner, s, m);
        }
        match self.put_finish(&p, sink, got).await {
            Ok((info, crc)) => Reply {
                owner_shard: owner,
                size: info.size_bytes,
                etag: info.etag.to_string(),
                mtime_ms: info.mtime_ms,
                crc32c: crc,
                ..Reply::default()
            },
            Err((s, m)) => failed(owner, s, m),
        }
    }

    /// Takes the upload's frames until the last one, checking each against
    /// the declared size and writing whole pieces to the sink.
    async fn put_receive(
        &self,
        id: u64,
        p: &proto::PutRequest,
        sink: &mut ObjectSink,
        data: &mut mpsc::Receiver<PutFrame>,
        got: &mut Received,
    ) -> Result<(), (Status, String)> {
        let wait = self.cfg.put_data_timeout;
        loop {
            // A client that stops sending mid-upload must not hold the
            // upload (its writer, pinned segments, a session on the owner,
            // the bucket's in-flight count) until the connection ends.
            let (bytes, crc_sent, _held) = match within(wait, data.next()).await {
                Some(Some(frame)) => frame,
                Some(None) => return Ok(()),
                None => {
                    tracing::warn!(
                        shard = self.shard.id,
                        request_id = id,
                        bucket = %p.bucket,
                        key = %p.key,
                        "native Put aborted: no PutData within {wait:?}"
                    );
                    return Err((Status::InvalidRequest, format!(
                        "no PutData for this Put within {} s; the upload was aborted and nothing was stored",
                        wait.as_secs_f64()
                    )));
                }
            };
            if let Some(c) = crc_sent {
                if got.declared_crc.replace(c).is_some() {
                    return Err((
                        Status::InvalidRequest,
                        "the CRC32C was sent twice (in Put and in PutData)".into(),
                    ));
                }
            }
            got.total_bytes += bytes.len() as u64;
            if got.total_bytes > p.size {
                return Err((
                    Status::InvalidRequest,
                    format!("more than the declared {} bytes were sent", p.size),
                ));
            }
            got.crc = proto::crc32c_append(got.crc, &bytes);
            crate::metrics::ShardMetrics::add(
                &self.shard.metrics().native_bytes_in,
                bytes.len() as u64,
            );
            if let Err(e) = got.pieces.push(sink, &bytes).await {
                return Err(status_of(&e));
            }
        }
    }

    /// Everything is checked before the object becomes visible: the size,
    /// then the CRC32C; then the last piece is written and the object
    /// installed with its ETag (MD5) and CRC32C. The object's info and
    /// CRC32C.
    async fn put_finish(
        &self,
        p: &proto::PutRequest,
        mut sink: ObjectSink,
        got: Received,
    ) -> Result<(ObjectInfo, u32), (Status, String)> {
        let (total, crc) = (got.total_bytes, got.crc);
        if total != p.size {
            return Err((
                Status::InvalidRequest,
                format!(
                    "{total} bytes were sent, {} declared (connection cut?)",
                    p.size
                ),
            ));
        }
        let Some(declared_crc) = got.declared_crc else {
            return Err((
                Status::InvalidRequest,
                "a Put must carry the object's CRC32C, in Put or in its last PutData".into(),
            ));
        };
        if crc != declared_crc {
            return Err((Status::ChecksumMismatch, format!("CRC32C of the received bytes is {crc:#010x}, the request says {declared_crc:#010x}; nothing was stored")));
        }
        let etag = hex::encode(got.pieces.md5().await);
        if let Err(e) = got.pieces.finish(&mut sink).await {
            return Err(status_of(&e));
        }
        use base64::Engine;
        let crc_b64 = base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes());
        let (info, version) = sink
            .finish_version(etag, vec![("x-amz-checksum-crc32c".to_string(), crc_b64)])
            .await
            .map_err(|e| status_of(&e))?;
        // In a versioned bucket: the version it wrote.
        let index_key = crate::cluster::replicate::index_key_of(&p.key, version.as_deref());
        self.replicated(&p.bucket, &index_key).await?;
        Ok((info, crc))
    }

    /// A cluster node: copies the state of the index key `key` (a key, or
    /// a real version's `\0v/KEY\0ID`) to its other replicas before a
    /// write is answered (`cluster::replicate`); Busy (retry) if they did
    /// not all take it.
    pub(super) async fn replicated(&self, bucket: &str, key: &str) -> Result<(), (Status, String)> {
        if !self.shard.is_cluster() {
            return Ok(());
        }
        let ckey = crate::cluster::peer_http::cluster_key(&self.cfg.credentials.secret_key);
        crate::cluster::replicate::replicate(&self.shard, &ckey, bucket, key)
            .await
            .map_err(|why| {
                (
                    Status::Busy,
                    format!("the write is stored on this node but its replicas did not all take it, so it is not acknowledged ({why}); retry"),
                )
            })
    }
}
