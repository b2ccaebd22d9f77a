//! Client::get and friends: ranges of one object, batches of objects per
//! owner shard, and streamed reads, every chunk checked against its CRC32C.

use super::*;

impl Client {
    /// Reads `ranges` of `key` (none: the whole object) into memory.
    pub async fn get(&self, bucket: &str, key: &str, ranges: &[Range]) -> Result<Object> {
        let item = BatchItem {
            key: key.into(),
            ranges: ranges.to_vec(),
        };
        let owner = self.owner(bucket, key);
        let req = Request::Get {
            bucket: bucket.into(),
            item,
        };
        let mut out = self.retry(true, || self.fetch(owner, &req, 1)).await?;
        let obj = out.pop().expect("one item")?;
        self.note_owner(owner, obj.owner_shard.into());
        Ok(obj)
    }

    /// Reads many objects (each with optional ranges) in one request per
    /// owner shard, all shards in parallel. Results in input order; a
    /// missing key fails only its own item.
    pub async fn get_batch(
        &self,
        bucket: &str,
        items: &[(String, Vec<Range>)],
    ) -> Result<Vec<Result<Object>>> {
        let n = self.shard_count();
        let max = (self.hello.batch_items_max.max(1) as usize).min(proto::BATCH_ITEMS_MAX as usize);
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, (key, _)) in items.iter().enumerate() {
            let s = if self.cfg.shard_aware {
                self.owner(bucket, key)
            } else {
                self.first_shard()
            };
            groups[s].push(i);
        }
        let mut calls = Vec::new();
        for (shard, idx) in groups.iter().enumerate() {
            for part in idx.chunks(max) {
                let req = Request::BatchGet {
                    bucket: bucket.into(),
                    items: part
                        .iter()
                        .map(|&i| BatchItem {
                            key: items[i].0.clone(),
                            ranges: items[i].1.clone(),
                        })
                        .collect(),
                };
                let count = part.len();
                calls.push(async move {
                    let r = self.retry(true, || self.fetch(shard, &req, count)).await;
                    (part, r)
                });
            }
        }
        let mut out: Vec<Option<Result<Object>>> = (0..items.len()).map(|_| None).collect();
        for (part, r) in futures::future::join_all(calls).await {
            let results = r?;
            for (&i, res) in part.iter().zip(results) {
                out[i] = Some(res);
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every item answered"))
            .collect())
    }

    /// One Get/BatchGet round: collects ItemHead and Chunk frames.
    async fn fetch(
        &self,
        shard: usize,
        req: &Request,
        count: usize,
    ) -> Result<Vec<Result<Object>>> {
        let conn = self.conn(shard).await?;
        let (_, mut rx) = conn.start(req, &[], false).await?;
        let mut items: Vec<Option<Result<Object>>> = (0..count).map(|_| None).collect();
        // Bytes still expected per (item, range).
        let mut filled: Vec<Vec<BytesMut>> = (0..count).map(|_| Vec::new()).collect();
        loop {
            let Some(Frame { msg, payload }) = rx.recv().await else {
                return Err(Error::Io(
                    std::io::ErrorKind::ConnectionReset.into(),
                    conn.shard,
                ));
            };
            match msg {
                ServerMessage::ItemHead(h) => {
                    let i = h.item as usize;
                    if i >= count || items[i].is_some() {
                        return Err(Error::Protocol(format!("unexpected item {i}")));
                    }
                    items[i] = Some(item_of(&h));
                    filled[i] = h
                        .ranges
                        .iter()
                        .map(|r| BytesMut::with_capacity(r.length.min(1 << 30) as usize))
                        .collect();
                }
                ServerMessage::Chunk(c) => chunk_into(&c, &payload, &items, &mut filled)?,
                ServerMessage::Reply(r) => {
                    if r.status != Status::Ok.0 {
                        return Err(Error::from_reply(&r));
                    }
                    let mut out = Vec::with_capacity(count);
                    for (i, it) in items.into_iter().enumerate() {
                        let mut it =
                            it.ok_or_else(|| Error::Protocol(format!("item {i} not answered")))?;
                        if let Ok(obj) = &mut it {
                            for (slot, data) in obj.ranges.iter_mut().zip(filled[i].drain(..)) {
                                if data.len() as u64 != slot.0.length {
                                    return Err(Error::Protocol(format!(
                                        "item {i}: {} of {} bytes",
                                        data.len(),
                                        slot.0.length
                                    )));
                                }
                                slot.1 = data.freeze();
                            }
                        }
                        out.push(it);
                    }
                    return Ok(out);
                }
                other => return Err(Error::Protocol(format!("unexpected frame {other:?}"))),
            }
        }
    }

    /// Streams one range of `key` (None: the whole object) chunk by chunk,
    /// for objects too large for memory: `sink` gets each verified chunk in
    /// order. Returns the object's metadata.
    pub async fn get_stream<F>(
        &self,
        bucket: &str,
        key: &str,
        range: Option<Range>,
        mut sink: F,
    ) -> Result<Object>
    where
        F: FnMut(u64, &[u8]) -> std::io::Result<()>,
    {
        let owner = self.owner(bucket, key);
        let conn = self.conn(owner).await?;
        let req = Request::Get {
            bucket: bucket.into(),
            item: BatchItem {
                key: key.into(),
                ranges: range.into_iter().collect(),
            },
        };
        let (_, mut rx) = conn.start(&req, &[], false).await?;
        let mut obj: Option<Object> = None;
        let mut next = 0u64;
        loop {
            let frame = tokio::time::timeout(self.cfg.timeout, rx.recv())
                .await
                .map_err(|_| Error::Timeout(self.cfg.timeout))?;
            let Some(Frame { msg, payload }) = frame else {
                return Err(Error::Io(
                    std::io::ErrorKind::ConnectionReset.into(),
                    conn.shard,
                ));
            };
            match msg {
                ServerMessage::ItemHead(h) => {
                    let o = item_of(&h)?;
                    next = o.ranges.first().map_or(0, |r| r.0.offset);
                    obj = Some(o);
                }
                ServerMessage::Chunk(c) => {
                    let got = proto::crc32c(&payload);
                    if got != c.crc32c {
                        return Err(Error::Checksum {
                            offset: c.offset,
                            got,
                            expected: c.crc32c,
                        });
                    }
                    if c.offset != next {
                        return Err(Error::Protocol(format!(
                            "chunk at {} where {next} was expected",
                            c.offset
                        )));
                    }
                    sink(c.offset, &payload).map_err(|e| Error::Io(e, conn.shard))?;
                    next += payload.len() as u64;
                }
                ServerMessage::Reply(r) => {
                    if r.status != Status::Ok.0 {
                        return Err(Error::from_reply(&r));
                    }
                    let o = obj.ok_or_else(|| Error::Protocol("no ItemHead".into()))?;
                    let end = o.ranges.first().map_or(0, |r| r.0.offset + r.0.length);
                    if next != end {
                        return Err(Error::Protocol(format!(
                            "stream ended at {next}, expected {end}"
                        )));
                    }
                    return Ok(o);
                }
                other => return Err(Error::Protocol(format!("unexpected frame {other:?}"))),
            }
        }
    }
}

fn item_of(h: &ItemHead) -> Result<Object> {
    if h.status != Status::Ok.0 {
        return Err(Error::Server {
            status: h.status,
            message: h.message.clone(),
        });
    }
    Ok(Object {
        size: h.size,
        etag: h.etag.clone(),
        mtime_ms: h.mtime_ms,
        content_type: h.content_type.clone(),
        owner_shard: h.owner_shard,
        ranges: h.ranges.iter().map(|r| (*r, Bytes::new())).collect(),
    })
}

fn chunk_into(
    c: &ChunkHead,
    payload: &Bytes,
    items: &[Option<Result<Object>>],
    filled: &mut [Vec<BytesMut>],
) -> Result<()> {
    let got = proto::crc32c(payload);
    if got != c.crc32c {
        return Err(Error::Checksum {
            offset: c.offset,
            got,
            expected: c.crc32c,
        });
    }
    let (i, r) = (c.item as usize, c.range as usize);
    let Some(Some(Ok(obj))) = items.get(i) else {
        return Err(Error::Protocol(format!("chunk for unknown item {i}")));
    };
    let Some((range, _)) = obj.ranges.get(r) else {
        return Err(Error::Protocol(format!(
            "chunk for unknown range {r} of item {i}"
        )));
    };
    let buf = &mut filled[i][r];
    if c.offset != range.offset + buf.len() as u64
        || buf.len() as u64 + payload.len() as u64 > range.length
    {
        return Err(Error::Protocol(format!(
            "chunk at {} does not continue range {r} of item {i}",
            c.offset
        )));
    }
    buf.extend_from_slice(payload);
    Ok(())
}
