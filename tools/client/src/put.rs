//! Client::put and friends: whole objects from memory (retried) and
//! streamed uploads (never retried), each sent to the key's owner shard.

use super::*;

impl Client {
    /// Stores `data` as `key` (retried on connection failures: the bytes
    /// are in memory).
    pub async fn put(&self, bucket: &str, key: &str, data: Bytes) -> Result<Stat> {
        self.put_with(bucket, key, data, "").await
    }

    pub async fn put_with(
        &self,
        bucket: &str,
        key: &str,
        data: Bytes,
        content_type: &str,
    ) -> Result<Stat> {
        let crc = proto::crc32c(&data);
        self.retry(true, || {
            let data = data.clone();
            async move {
                let mut src: &[u8] = &data;
                self.put_stream_inner(
                    bucket,
                    key,
                    data.len() as u64,
                    content_type,
                    &mut src,
                    Some(crc),
                    &mut |_| {},
                )
                .await
            }
        })
        .await
    }

    /// Streams `size` bytes from `reader` as `key`, computing the CRC32C on
    /// the way (sent in the last frame). `progress` gets bytes sent so far.
    /// Not retried: the reader cannot be rewound.
    /// On a cluster, a WrongNode answer (the map changed) fetches the map,
    /// so that the caller's next attempt goes to the right node.
    pub async fn put_stream<R: AsyncRead + Unpin + Send>(
        &self,
        bucket: &str,
        key: &str,
        size: u64,
        content_type: &str,
        reader: &mut R,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<Stat> {
        let got = self
            .put_stream_inner(bucket, key, size, content_type, reader, None, progress)
            .await;
        if matches!(&got, Err(e) if e.status() == Some(Status::WrongNode)) {
            let _ = self.refresh_map().await;
        }
        got
    }

    #[allow(clippy::too_many_arguments)]
    async fn put_stream_inner<R: AsyncRead + Unpin + Send>(
        &self,
        bucket: &str,
        key: &str,
        size: u64,
        content_type: &str,
        reader: &mut R,
        crc_known: Option<u32>,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<Stat> {
        let owner = self.owner(bucket, key);
        let r = self.routes();
        let conn = self.conn(&r, self.slot(&r, bucket, key)).await?;
        let frame_max = (self.hello.frame_payload_max.min(proto::PAYLOAD_BYTES_MAX) as usize)
            .clamp(64 * 1024, 1 << 20);
        let mut buf = vec![0u8; frame_max];
        let first = fill(reader, &mut buf[..(size.min(frame_max as u64) as usize)])
            .await
            .map_err(|e| Error::Io(e, owner))?;
        let mut crc = proto::crc32c(&buf[..first]);
        let mut sent = first as u64;
        let req = Request::Put(proto::PutRequest {
            bucket: bucket.into(),
            key: key.into(),
            size,
            content_type: content_type.into(),
            crc32c: crc_known,
        });
        let last_in_put = sent >= size;
        if last_in_put && crc_known.is_none() {
            // Small object: the CRC is known now; send it in Put.
            return self
                .put_small(conn, bucket, key, size, content_type, &buf[..first])
                .await;
        }
        let (id, mut rx) = conn.start(&req, &buf[..first], !last_in_put).await?;
        progress(sent);
        while sent < size {
            // An early Reply (an error) stops the upload.
            if let Ok(f) = rx.try_recv() {
                return finish_put(f, owner, self);
            }
            let want = ((size - sent) as usize).min(frame_max);
            let n = fill(reader, &mut buf[..want])
                .await
                .map_err(|e| Error::Io(e, owner))?;
            if n == 0 {
                return Err(Error::Protocol(format!(
                    "the source ended after {sent} of {size} bytes"
                )));
            }
            crc = proto::crc32c_append(crc, &buf[..n]);
            sent += n as u64;
            let last = sent >= size;
            let header = if last && crc_known.is_none() {
                Request::PutData { crc32c: Some(crc) }.encode()
            } else {
                Vec::new()
            };
            conn.send(Kind::PutData, id, &header, &buf[..n], !last)
                .await?;
            progress(sent);
        }
        match rx.recv().await {
            Some(f) => finish_put(f, owner, self),
            None => Err(Error::Io(std::io::ErrorKind::ConnectionReset.into(), owner)),
        }
    }

    async fn put_small(
        &self,
        conn: Arc<Conn>,
        bucket: &str,
        key: &str,
        size: u64,
        content_type: &str,
        data: &[u8],
    ) -> Result<Stat> {
        let req = Request::Put(proto::PutRequest {
            bucket: bucket.into(),
            key: key.into(),
            size,
            content_type: content_type.into(),
            crc32c: Some(proto::crc32c(data)),
        });
        let (_, mut rx) = conn.start(&req, data, false).await?;
        match rx.recv().await {
            Some(f) => finish_put(f, conn.shard, self),
            None => Err(Error::Io(
                std::io::ErrorKind::ConnectionReset.into(),
                conn.shard,
            )),
        }
    }
}

fn finish_put(f: Frame, owner: usize, client: &Client) -> Result<Stat> {
    match f.msg {
        ServerMessage::Reply(r) => {
            if r.status != Status::Ok.0 {
                return Err(Error::from_reply(&r));
            }
            client.note_owner(owner, r.owner_shard.into());
            Ok(Stat::from(r))
        }
        other => Err(Error::Protocol(format!("unexpected frame {other:?}"))),
    }
}

async fn fill<R: AsyncRead + Unpin + Send>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        let n = r.read(&mut buf[at..]).await?;
        if n == 0 {
            break;
        }
        at += n;
    }
    Ok(at)
}
