//! Reading and writing one object from the shard a request arrived on:
//! directly when this shard owns the key, through a session on the owner
//! otherwise. The front doors use only these two types.

use std::ops::Deref;
use std::rc::Rc;

use bytes::Bytes;

use super::msg::{Op, Reply, SessionId, ShardError};
use super::{store_error, Shard};
use crate::store::record::ObjectMeta;
use crate::store::versions::Pick;
use crate::store::{ObjectInfo, ObjectReader, Payload, PutCondition, PutWriter};

/// Bytes of an object: a verified view of a read buffer or of the object
/// cache (local) or a copy that crossed from the owner shard (remote).
pub enum Chunk {
    Local(Payload),
    Remote(Bytes),
}

impl Deref for Chunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Chunk::Local(r) => r,
            Chunk::Remote(b) => b,
        }
    }
}

fn unexpected(r: Reply) -> ShardError {
    match r {
        Reply::Err(e) => e,
        other => ShardError::Internal(format!("unexpected reply {other:?}")),
    }
}

pub enum ObjectSource {
    Local(ObjectReader),
    Remote {
        shard: Rc<Shard>,
        owner: usize,
        session: Option<SessionId>,
    },
}

impl ObjectSource {
    pub async fn open(
        shard: &Rc<Shard>,
        bucket: &str,
        key: &str,
    ) -> Result<(ObjectSource, Rc<ObjectMeta>), ShardError> {
        Self::open_version(shard, bucket, key, Pick::Current)
            .await
            .map(|(source, meta, _)| (source, meta))
    }

    /// Opens the version `pick` names, with the version id to show (None:
    /// the bucket was never versioned).
    pub async fn open_version(
        shard: &Rc<Shard>,
        bucket: &str,
        key: &str,
        pick: Pick,
    ) -> Result<(ObjectSource, Rc<ObjectMeta>, Option<String>), ShardError> {
        let owner = shard.owner_of(bucket, key);
        if owner == shard.id {
            let (reader, version_id) = shard.open_local(bucket, key, pick).await?;
            let meta = reader.meta.clone();
            return Ok((ObjectSource::Local(reader), meta, version_id));
        }
        match shard
            .call(
                owner,
                Op::ReadOpen {
                    bucket: bucket.into(),
                    key: key.into(),
                    pick,
                },
            )
            .await
        {
            Reply::Opened {
                session,
                meta,
                version_id,
            } => Ok((
                ObjectSource::Remote {
                    shard: shard.clone(),
                    owner,
                    session: Some(session),
                },
                Rc::new(meta),
                version_id,
            )),
            other => Err(unexpected(other)),
        }
    }

    /// The zero-copy read: into a registered buffer of `ring` (see
    /// `ObjectReader::read_fixed`). None for remote sources and parts that
    /// cannot be read that way.
    pub async fn read_fixed(
        &mut self,
        ring: &crate::ring::DataRing,
        offset: u64,
        len_bytes: u64,
    ) -> Option<Result<(crate::ring::PoolBuf, usize, usize), ShardError>> {
        match self {
            ObjectSource::Local(r) => r
                .read_fixed(ring, offset, len_bytes)
                .await
                .map(|r| r.map_err(store_error)),
            _ => None,
        }
    }

    /// Up to `len_bytes` at `offset`; shorter at internal boundaries.
    pub async fn read(&mut self, offset: u64, len_bytes: u64) -> Result<Chunk, ShardError> {
        match self {
            ObjectSource::Local(r) => r
                .read(offset, len_bytes)
                .await
                .map(Chunk::Local)
                .map_err(store_error),
            ObjectSource::Remote {
                shard,
                owner,
                session,
            } => {
                let session = session.expect("open session");
                match shard
                    .call(
                        *owner,
                        Op::ReadChunk {
                            session,
                            offset,
                            len_bytes,
                        },
                    )
                    .await
                {
                    Reply::Data(b) => Ok(Chunk::Remote(b)),
                    other => Err(unexpected(other)),
                }
            }
        }
    }
}

impl Drop for ObjectSource {
    fn drop(&mut self) {
        if let ObjectSource::Remote {
            shard,
            owner,
            session,
        } = self
        {
            if let Some(session) = session.take() {
                let (shard, owner) = (shard.clone(), *owner);
                glommio::spawn_local(async move {
                    shard.call(owner, Op::ReadClose { session }).await;
                })
                .detach();
            }
        }
    }
}

/// Where a PUT's bytes go: the local store's writer, or a session on the
/// owner shard.
#[allow(clippy::large_enum_variant)] // one per upload; boxing the writer would add an allocation per PUT
pub enum ObjectSink {
    Local {
        shard: Rc<Shard>,
        writer: Option<PutWriter>,
    },
    Remote {
        shard: Rc<Shard>,
        owner: usize,
        session: Option<SessionId>,
    },
}

impl ObjectSink {
    /// Starts a PUT on the owner; fails with NoSuchBucket if the bucket is
    /// missing or being deleted.
    pub async fn open(
        shard: &Rc<Shard>,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
    ) -> Result<ObjectSink, ShardError> {
        Self::open_part(shard, bucket, key, meta, None, None).await
    }

    /// Like `open`; with `part` = (upload id, number), a multipart part.
    pub async fn open_part(
        shard: &Rc<Shard>,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        part: Option<(String, u32)>,
        condition: Option<PutCondition>,
    ) -> Result<ObjectSink, ShardError> {
        let owner = shard.owner_of(bucket, key);
        if owner == shard.id {
            let writer = shard.open_writer(bucket, key, meta, part.as_ref(), condition)?;
            return Ok(ObjectSink::Local {
                shard: shard.clone(),
                writer: Some(writer),
            });
        }
        match shard
            .call(
                owner,
                Op::PutOpen {
                    bucket: bucket.into(),
                    key: key.into(),
                    meta,
                    part,
                    condition,
                },
            )
            .await
        {
            Reply::Session(session) => Ok(ObjectSink::Remote {
                shard: shard.clone(),
                owner,
                session: Some(session),
            }),
            other => Err(unexpected(other)),
        }
    }

    pub async fn write(&mut self, data: Bytes) -> Result<(), ShardError> {
        match self {
            ObjectSink::Local { writer, .. } => writer
                .as_mut()
                .expect("open writer")
                .write(data)
                .await
                .map_err(store_error),
            ObjectSink::Remote {
                shard,
                owner,
                session,
            } => {
                let session = session.expect("open session");
                match shard.call(*owner, Op::PutData { session, data }).await {
                    Reply::Ok => Ok(()),
                    other => Err(unexpected(other)),
                }
            }
        }
    }

    /// Makes the object durable and visible.
    pub async fn finish(self, etag: String) -> Result<ObjectInfo, ShardError> {
        self.finish_with(etag, Vec::new()).await
    }

    /// Like `finish`, adding stored headers known only now.
    pub async fn finish_with(
        self,
        etag: String,
        headers: Vec<(String, String)>,
    ) -> Result<ObjectInfo, ShardError> {
        self.finish_version(etag, headers)
            .await
            .map(|(info, _)| info)
    }

    /// `finish_with`, also returning the version id to show (None: the
    /// bucket was never versioned).
    pub async fn finish_version(
        mut self,
        etag: String,
        headers: Vec<(String, String)>,
    ) -> Result<(ObjectInfo, Option<String>), ShardError> {
        match &mut self {
            ObjectSink::Local { shard, writer } => {
                let mut w = writer.take().expect("open writer");
                w.set_etag(etag);
                w.add_headers(headers);
                let bucket = w.bucket().to_string();
                let result = w.finish_version().await.map_err(store_error);
                shard.put_ended(&bucket);
                let (info, version) = result?;
                Ok((info, shard.version_label(&bucket, version)))
            }
            ObjectSink::Remote {
                shard,
                owner,
                session,
            } => {
                let session = session.take().expect("open session");
                match shard
                    .call(
                        *owner,
                        Op::PutFinish {
                            session,
                            etag,
                            headers,
                        },
                    )
                    .await
                {
                    Reply::Put(info, version) => Ok((info, version)),
                    other => Err(unexpected(other)),
                }
            }
        }
    }
}

impl Drop for ObjectSink {
    /// An unfinished PUT leaves nothing visible; release its session.
    fn drop(&mut self) {
        match self {
            ObjectSink::Local { shard, writer } => {
                if let Some(w) = writer.take() {
                    shard.put_ended(w.bucket());
                }
            }
            ObjectSink::Remote {
                shard,
                owner,
                session,
            } => {
                if let Some(session) = session.take() {
                    let (shard, owner) = (shard.clone(), *owner);
                    glommio::spawn_local(async move {
                        shard.call(owner, Op::PutAbort { session }).await;
                    })
                    .detach();
                }
            }
        }
    }
}
