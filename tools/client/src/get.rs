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
        let req = Request::Get {
            bucket: bucket.into(),
            item,
        };
        let mut out = self
            .retry(true, || async {
                let r = self.routes();
                self.fetch(&r, self.slot(&r, bucket, key), &req, 1).await
            })
            .await?;
        let obj = out.pop().expect("one item")?;
        self.note_owner(self.owner(bucket, key), obj.owner_shard.into());
        Ok(obj)
    }

    /// Reads many objects (each with optional ranges) in one request per
    /// owner shard (on a cluster: per node and shard), all in parallel.
    /// Results in input order; a missing key fails only its own item.
    pub async fn get_batch(
        &self,
        bucket: &str,
        items: &[(String, Vec<Range>)],
    ) -> Result<Vec<Result<Object>>> {
        let mut out: Vec<Option<Result<Object>>> = (0..items.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        let mut wrong_node = 0;
        while !pending.is_empty() {
            let r = self.routes();
            let moved = self
                .get_batch_round(&r, bucket, items, &pending, &mut out)
                .await?;
            if moved.is_empty() {
                break;
            }
            // Some node answered WrongNode: fetch the map, regroup those.
            wrong_node += 1;
            if wrong_node >= WRONG_NODE_ATTEMPTS {
                return Err(Error::Server {
                    status: Status::WrongNode.0,
                    message:
                        "the cluster's nodes kept refusing keys as not theirs; is the map changing?"
                            .into(),
                });
            }
            self.follow_map(wrong_node).await;
            pending = moved;
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every item answered"))
            .collect())
    }

    /// One round of `get_batch` over the items `pending`, grouped by the
    /// slots of `r`: fills `out`, and returns the items of the groups a
    /// node refused as not its own.
    async fn get_batch_round(
        &self,
        r: &Routes,
        bucket: &str,
        items: &[(String, Vec<Range>)],
        pending: &[usize],
        out: &mut [Option<Result<Object>>],
    ) -> Result<Vec<usize>> {
        let max = (self.hello.batch_items_max.max(1) as usize).min(proto::BATCH_ITEMS_MAX as usize);
        let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
        for &i in pending {
            groups
                .entry(self.slot(r, bucket, &items[i].0))
                .or_default()
                .push(i);
        }
        let mut calls = Vec::new();
        for (&slot, idx) in &groups {
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
                    let got = self
                        .retry_with(true, false, || self.fetch(r, slot, &req, count))
                        .await;
                    (part, got)
                });
            }
        }
        let mut moved = Vec::new();
        for (part, got) in futures::future::join_all(calls).await {
            match got {
                Ok(results) => {
                    for (&i, res) in part.iter().zip(results) {
                        out[i] = Some(res);
                    }
                }
                Err(e) if e.status() == Some(Status::WrongNode) => moved.extend_from_slice(part),
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }

    /// One Get/BatchGet round: collects ItemHead and Chunk frames.
    async fn fetch(
        &self,
        r: &Routes,
        slot: usize,
        req: &Request,
        count: usize,
    ) -> Result<Vec<Result<Object>>> {
        let conn = self.conn(r, slot).await?;
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
        // A WrongNode answer comes before any byte: safe to send again.
        let mut wrong_node = 0;
        loop {
            match self.get_stream_once(bucket, key, range, &mut sink).await {
                Err(e) if e.status() == Some(Status::WrongNode) => {
                    wrong_node += 1;
                    if wrong_node >= WRONG_NODE_ATTEMPTS {
                        return Err(e);
                    }
                    self.follow_map(wrong_node).await;
                }
                r => return r,
            }
        }
    }

    async fn get_stream_once<F>(
        &self,
        bucket: &str,
        key: &str,
        range: Option<Range>,
        sink: &mut F,
    ) -> Result<Object>
    where
        F: FnMut(u64, &[u8]) -> std::io::Result<()>,
    {
        let r = self.routes();
        let conn = self.conn(&r, self.slot(&r, bucket, key)).await?;
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
