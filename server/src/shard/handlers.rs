//! Running an `Op` on the shard that owns its data: `Shard::execute`
//! dispatches, one function per operation does the work against the store
//! (or the session table) and answers with a `Reply`. Whatever the caller's
//! shard, this is where an operation finally runs.

use std::rc::Rc;

use bytes::Bytes;

use super::buckets::WriteInProgress;
use super::msg::{Op, Removed, Reply, SessionId, ShardError};
use super::sessions::Session;
use super::{store_error, Shard};
use crate::bucket_config::tagging::OBJECT_TAGS_HEADER;
use crate::store::checksum::UploadChecksum;
use crate::store::mpu::CompletionChecks;
use crate::store::record::ObjectMeta;
use crate::store::versions::{version_id, Pick, Versioning};
use crate::store::{ObjectReader, PutCondition, PutWriter, StoreError};

impl Shard {
    /// Starts a local PUT (or multipart part) of `key`, counted against
    /// the bucket until it ends.
    pub fn open_writer(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        part: Option<&(String, u32)>,
        condition: Option<PutCondition>,
    ) -> Result<PutWriter, ShardError> {
        if !self.bucket_exists(bucket) {
            return Err(ShardError::NoSuchBucket);
        }
        // A client's write (a replica's copy carries its stamp) is refused
        // while a cluster DeleteBucket holds the bucket closed; counted
        // below in this same turn otherwise (`bucket_close`).
        let copy = condition
            .as_ref()
            .is_some_and(|c| c.preset_stamp().is_some());
        if !copy && self.bucket_closed(bucket) {
            return Err(ShardError::BucketClosing);
        }
        if let Some(c) = &condition {
            // Fail fast, before the body is sent; checked again at install.
            self.store
                .check_put_condition(bucket, key, c)
                .map_err(store_error)?;
        }
        let mut writer = match part {
            None => self.store.put_stream(bucket, key, meta),
            Some((upload_id, number)) => self
                .store
                .put_part_stream(bucket, key, upload_id, *number)
                .map_err(store_error)?,
        };
        if let Some(c) = condition {
            writer.set_condition(c);
        }
        // A client's write in a versioned bucket is a new real version; a
        // replica's copy (it carries its primary's stamp) is written at the
        // index key it names (`cluster::replicate`).
        if part.is_none() && !copy && self.versioning(bucket) == Versioning::Enabled {
            writer.set_new_version();
        }
        self.put_started(bucket);
        Ok(writer)
    }

    /// `bucket`'s versioning state on this shard.
    pub fn versioning(&self, bucket: &str) -> Versioning {
        self.buckets
            .borrow()
            .get(bucket)
            .map_or(Versioning::Off, |b| b.config.versioning)
    }

    /// The version id to show for `version` of an object in `bucket`
    /// (None: the bucket was never versioned, S3 shows none).
    pub fn version_label(&self, bucket: &str, version: Option<u64>) -> Option<String> {
        if version.is_none() && self.versioning(bucket) == Versioning::Off {
            return None;
        }
        Some(version_id(version))
    }

    /// Opens the version `pick` names, here (its owner); with the version
    /// id to show.
    pub async fn open_local(
        &self,
        bucket: &str,
        key: &str,
        pick: Pick,
    ) -> Result<(ObjectReader, Option<String>), ShardError> {
        if pick == Pick::Current && !self.store.has_versions(bucket) {
            return match self.store.open_read(bucket, key).await {
                Ok(reader) => Ok((reader, self.version_label(bucket, None))),
                // A null delete marker (a suspended bucket's DELETE) is no
                // object: say it is a marker.
                Err(StoreError::NotFound) => Err(store_error(
                    match self.store.resolve(bucket, key, Pick::Null) {
                        Some(found) if found.marker.is_some() => StoreError::DeleteMarker {
                            version: None,
                            named: false,
                        },
                        _ => StoreError::NotFound,
                    },
                )),
                Err(e) => Err(store_error(e)),
            };
        }
        let found = self
            .store
            .version_to_read(bucket, key, pick)
            .map_err(store_error)?;
        let reader = self
            .store
            .open_read(bucket, &found.index_key)
            .await
            .map_err(store_error)?;
        Ok((reader, self.version_label(bucket, found.version)))
    }

    async fn delete_here(&self, bucket: &str, key: &str, pick: Pick) -> Reply {
        let mode = self.versioning(bucket);
        // A delete marker is a version: like a PUT it needs the bucket and
        // counts as a write in progress for DeleteBucket.
        let _writing = match (mode != Versioning::Off || pick != Pick::Current)
            .then(|| self.client_write(bucket))
            .transpose()
        {
            Ok(w) => w,
            Err(e) => return Reply::Err(e),
        };
        if _writing.is_some() && !self.bucket_exists(bucket) {
            return Reply::Err(ShardError::NoSuchBucket);
        }
        match self.store.delete_object(bucket, key, mode, pick).await {
            Ok(done) => Reply::Deleted(Removed {
                existed: done.existed,
                version_id: done.version.map(|v| {
                    self.version_label(bucket, v)
                        .unwrap_or_else(|| version_id(v))
                }),
                marker: done.marker,
            }),
            Err(e) => Reply::Err(store_error(e)),
        }
    }

    /// Runs `op` here, on its owner: the dispatch to one handler per `Op`.
    pub async fn execute(self: &Rc<Self>, op: Op) -> Reply {
        match op {
            Op::Head { bucket, key } => Reply::Head(self.store.current_info(&bucket, &key)),
            Op::ReadOpen { bucket, key, pick } => self.read_open(&bucket, &key, pick).await,
            Op::ReadChunk {
                session,
                offset,
                len_bytes,
            } => self.read_chunk(session, offset, len_bytes).await,
            Op::ReadClose { session } | Op::PutAbort { session } => {
                self.session_close(session);
                Reply::Ok
            }
            Op::PutOpen {
                bucket,
                key,
                meta,
                part,
                condition,
            } => self.put_open(&bucket, &key, meta, part, condition),
            Op::PutData { session, data } => self.put_data(session, data).await,
            Op::PutFinish {
                session,
                etag,
                headers,
            } => self.put_finish(session, etag, headers).await,
            Op::Delete { bucket, key, pick } => self.delete_here(&bucket, &key, pick).await,
            Op::SetTags {
                bucket,
                key,
                pick,
                tags,
            } => self.set_tags(&bucket, &key, pick, tags).await,
            Op::List {
                bucket,
                prefix,
                start_after,
                delimiter,
                limit,
                versions,
            } => Reply::List(self.store.list_keys(
                &bucket,
                &prefix,
                &start_after,
                delimiter.as_deref(),
                limit,
                versions,
            )),
            op @ (Op::MpuCreate { .. }
            | Op::MpuChecksum { .. }
            | Op::MpuComplete { .. }
            | Op::MpuAbort { .. }
            | Op::MpuParts { .. }
            | Op::MpuList { .. }) => self.execute_mpu(op).await,
            Op::Metrics => Reply::Metrics(Box::new(self.metrics_snapshot())),
            Op::DropCache => {
                self.store.drop_object_cache();
                Reply::Ok
            }
            Op::Start => self.start().await,
            Op::TakeNodeMac { mac } => Reply::Count(self.take_node_mac_here(mac) as usize),
            Op::KeyState { bucket, key } => Reply::KeyState(self.key_state_here(&bucket, &key)),
            Op::DeleteStamped {
                bucket,
                key,
                condition,
                fence_max,
                marker,
            } => {
                if self.fence.get() > fence_max {
                    return Reply::Count(0);
                }
                let written = if marker {
                    self.store.marker_stamped(&bucket, &key, condition).await
                } else {
                    self.store.delete_stamped(&bucket, &key, condition).await
                };
                match written {
                    Ok(applied) => Reply::Count(usize::from(applied)),
                    Err(e) => Reply::Err(super::store_error(e)),
                }
            }
            Op::Digest {
                after,
                limit,
                pgs,
                epoch,
            } => self.digest_here(after, limit, pgs.as_deref(), epoch),
            Op::Fence { epoch } => Reply::Count(self.raise_fence(epoch) as usize),
            // Buckets, their configurations and users (`is_bucket_op`).
            op => self.execute_bucket_op(op).await,
        }
    }

    /// Runs a multipart upload `op` here, on the upload's owner.
    async fn execute_mpu(&self, op: Op) -> Reply {
        match op {
            Op::MpuCreate {
                bucket,
                key,
                meta,
                checksum,
            } => self.mpu_create_here(&bucket, &key, meta, checksum).await,
            Op::MpuChecksum { bucket, .. } if !self.bucket_exists(&bucket) => {
                Reply::Err(ShardError::NoSuchBucket)
            }
            Op::MpuChecksum {
                bucket,
                key,
                upload_id,
            } => match self.store.mpu_checksum(&bucket, &key, &upload_id) {
                Ok(c) => Reply::UploadChecksum(c),
                Err(e) => Reply::Err(store_error(e)),
            },
            Op::MpuComplete {
                bucket,
                key,
                upload_id,
                parts,
                checks,
            } => {
                self.mpu_complete_here(&bucket, &key, &upload_id, &parts, &checks)
                    .await
            }
            Op::MpuAbort {
                bucket,
                key,
                upload_id,
            } => done(self.store.mpu_abort(&bucket, &key, &upload_id).await),
            Op::MpuParts {
                bucket,
                key,
                upload_id,
                after,
                limit,
            } => match self
                .store
                .mpu_parts_with_checksums(&bucket, &key, &upload_id, after, limit)
                .await
            {
                Ok((parts, checksum)) => Reply::Parts(parts, checksum),
                Err(e) => Reply::Err(store_error(e)),
            },
            Op::MpuList {
                bucket,
                prefix,
                key_marker,
                upload_id_marker,
                limit,
            } => Reply::Uploads(self.store.mpu_list(
                &bucket,
                &prefix,
                &key_marker,
                &upload_id_marker,
                limit,
            )),
            _ => unreachable!("execute_mpu runs multipart ops only"),
        }
    }

    async fn set_tags(&self, bucket: &str, key: &str, pick: Pick, tags: Option<String>) -> Reply {
        let set = self
            .store
            .set_version_header(bucket, key, pick, OBJECT_TAGS_HEADER, tags);
        match set.await {
            Ok(version) => Reply::Version(self.version_label(bucket, version)),
            Err(e) => Reply::Err(store_error(e)),
        }
    }

    async fn read_open(&self, bucket: &str, key: &str, pick: Pick) -> Reply {
        match self.open_local(bucket, key, pick).await {
            Ok((reader, version_id)) => {
                let meta = ObjectMeta::clone(&reader.meta);
                match self.new_session(Session::Read(reader)) {
                    Ok(session) => Reply::Opened {
                        session,
                        meta,
                        version_id,
                    },
                    Err(e) => Reply::Err(e),
                }
            }
            Err(e) => Reply::Err(e),
        }
    }

    async fn read_chunk(&self, session: SessionId, offset: u64, len_bytes: u64) -> Reply {
        let mut reader = match self.session_take(session) {
            Ok(Session::Read(r)) => r,
            Ok(other) => {
                self.session_return(session, other);
                return Reply::Err(ShardError::Internal("not a read session".into()));
            }
            Err(e) => return Reply::Err(e),
        };
        let result = reader.read(offset, len_bytes).await;
        let reply = match result {
            Ok(data) => Reply::Data(Bytes::copy_from_slice(&data)),
            Err(e) => Reply::Err(store_error(e)),
        };
        self.session_return(session, Session::Read(reader));
        reply
    }

    fn put_open(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        part: Option<(String, u32)>,
        condition: Option<PutCondition>,
    ) -> Reply {
        let writer = match self.open_writer(bucket, key, meta, part.as_ref(), condition) {
            Ok(w) => w,
            Err(e) => return Reply::Err(e),
        };
        match self.new_session(Session::Put(writer)) {
            Ok(id) => Reply::Session(id),
            Err(e) => {
                self.put_ended(bucket);
                Reply::Err(e)
            }
        }
    }

    /// Takes the PUT session `session` out of the table for one operation.
    fn put_session_take(&self, session: SessionId) -> Result<PutWriter, ShardError> {
        match self.session_take(session) {
            Ok(Session::Put(w)) => Ok(w),
            Ok(other) => {
                self.session_return(session, other);
                Err(ShardError::Internal("not a put session".into()))
            }
            Err(e) => Err(e),
        }
    }

    async fn put_data(&self, session: SessionId, data: Bytes) -> Reply {
        let mut w = match self.put_session_take(session) {
            Ok(w) => w,
            Err(e) => return Reply::Err(e),
        };
        match w.write(data).await {
            Ok(()) => {
                self.session_return(session, Session::Put(w));
                Reply::Ok
            }
            Err(e) => {
                self.session_remove(session);
                self.session_ended(Session::Put(w));
                Reply::Err(store_error(e))
            }
        }
    }

    async fn put_finish(
        &self,
        session: SessionId,
        etag: String,
        headers: Vec<(String, String)>,
    ) -> Reply {
        let mut w = match self.put_session_take(session) {
            Ok(w) => w,
            Err(e) => return Reply::Err(e),
        };
        // Listed (busy) until the object is installed, so that the
        // session count stays honest; a close meanwhile is moot.
        let bucket = w.bucket().to_string();
        w.set_etag(etag);
        w.add_headers(headers);
        let result = w.finish_version().await;
        self.session_remove(session);
        self.put_ended(&bucket);
        match result {
            Ok((info, version)) => Reply::Put(info, self.version_label(&bucket, version)),
            Err(e) => Reply::Err(store_error(e)),
        }
    }

    async fn mpu_create_here(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        checksum: Option<UploadChecksum>,
    ) -> Reply {
        if !self.bucket_exists(bucket) {
            return Reply::Err(ShardError::NoSuchBucket);
        }
        // A write in progress for DeleteBucket, which would otherwise
        // miss an upload installed after its purge.
        let _writing = WriteInProgress::new(self, bucket);
        let result = self
            .store
            .mpu_create_with_checksum(bucket, key, meta, checksum)
            .await;
        match result {
            Ok(id) => Reply::Upload(id),
            Err(e) => Reply::Err(store_error(e)),
        }
    }

    async fn mpu_complete_here(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        checks: &CompletionChecks,
    ) -> Reply {
        if !self.bucket_exists(bucket) {
            return Reply::Err(ShardError::NoSuchBucket);
        }
        // Counted until done, even if this future is dropped (a
        // local call runs in its caller's future).
        let _writing = match self.client_write(bucket) {
            Ok(w) => w,
            Err(e) => return Reply::Err(e),
        };
        let new_version = self.versioning(bucket) == Versioning::Enabled;
        let result = self
            .store
            .mpu_complete_version(bucket, key, upload_id, parts, checks, new_version)
            .await;
        match result {
            Ok(done) => Reply::Completed(
                done.info,
                self.version_label(bucket, done.version),
                done.checksum,
            ),
            Err(e) => Reply::Err(store_error(e)),
        }
    }
}

/// Ok, or the store's error.
fn done(r: crate::store::Result<()>) -> Reply {
    r.map_or_else(|e| Reply::Err(store_error(e)), |()| Reply::Ok)
}
