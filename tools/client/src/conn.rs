//! One connection to one shard: the handshake, a reader task that routes
//! frames to the requests waiting for them, and ordered writes.

use super::*;

/// A frame from the server, payload included.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) msg: ServerMessage,
    pub(crate) payload: Bytes,
}

pub(crate) type Pending = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Frame>>>>;

/// One authenticated connection to one shard.
pub(crate) struct Conn {
    pub(crate) shard: usize,
    pub(crate) writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pub(crate) pending: Pending,
    pub(crate) next_id: AtomicU64,
    pub(crate) closed: Arc<AtomicBool>,
    pub(crate) hello: HelloOk,
    pub(crate) reader: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn read_frame(rd: &mut OwnedReadHalf) -> std::io::Result<(FrameHeader, Vec<u8>, Bytes)> {
    let mut h = [0u8; proto::FRAME_HEADER_BYTES];
    rd.read_exact(&mut h).await?;
    let fh = FrameHeader::decode(&h)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut header = vec![0u8; fh.header_len as usize];
    rd.read_exact(&mut header).await?;
    let mut payload = BytesMut::zeroed(fh.payload_len as usize);
    rd.read_exact(&mut payload).await?;
    Ok((fh, header, payload.freeze()))
}

pub(crate) fn decode(fh: &FrameHeader, header: &[u8]) -> std::io::Result<ServerMessage> {
    proto::decode_server(fh.kind, header)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.0))
}

impl Conn {
    // Connect, challenge, hello, check the server's proof: the handshake
    // is one sequence and reads best whole.
    #[allow(clippy::too_many_lines)]
    pub(crate) async fn open(addr: SocketAddr, cfg: &Config, shard_hint: usize) -> Result<Conn> {
        let stream = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Connect {
                addr,
                source: std::io::ErrorKind::TimedOut.into(),
            })?
            .map_err(|source| Error::Connect { addr, source })?;
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let io = |e: std::io::Error| Error::Io(e, shard_hint);
        let hello = async {
            let (fh, header, _) = read_frame(&mut rd).await.map_err(io)?;
            let challenge = match decode(&fh, &header).map_err(io)? {
                ServerMessage::Challenge(c) => c,
                ServerMessage::Reply(r) => return Err(Error::from_reply(&r)),
                other => {
                    return Err(Error::Protocol(format!(
                        "expected Challenge, got {other:?}"
                    )))
                }
            };
            if !challenge.versions.contains(&proto::VERSION) {
                return Err(Error::Protocol(format!(
                    "server speaks protocol versions {:?}, this client {}; upgrade one of them",
                    challenge.versions,
                    proto::VERSION
                )));
            }
            let client_nonce: [u8; proto::NONCE_BYTES] = rand::random();
            let mac = proto::client_mac(
                &cfg.secret_key,
                &cfg.access_key,
                &challenge.server_nonce,
                &client_nonce,
            );
            let req = Request::Hello(proto::Hello {
                version: proto::VERSION,
                access_key: cfg.access_key.clone(),
                client_nonce: client_nonce.to_vec(),
                mac: mac.to_vec(),
                client_name: format!("percore-client/{}", env!("CARGO_PKG_VERSION")),
            });
            let header = req.encode();
            wr.write_all(&proto::frame(Kind::Hello, 1, false, &header, 0))
                .await
                .map_err(io)?;
            let (fh, header, _) = read_frame(&mut rd).await.map_err(io)?;
            match decode(&fh, &header).map_err(io)? {
                ServerMessage::HelloOk(ok) => {
                    let proof = proto::server_proof(
                        &cfg.secret_key,
                        &challenge.server_nonce,
                        &client_nonce,
                    );
                    if !proto::mac_equal(&ok.server_proof, &proof) {
                        return Err(Error::Protocol(
                            "the server could not prove it holds the secret key; wrong server?"
                                .into(),
                        ));
                    }
                    Ok(ok)
                }
                ServerMessage::Reply(r) => Err(Error::from_reply(&r)),
                other => Err(Error::Protocol(format!("expected HelloOk, got {other:?}"))),
            }
        };
        let hello = tokio::time::timeout(cfg.timeout, hello)
            .await
            .map_err(|_| Error::Timeout(cfg.timeout))??;
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let reader = {
            let (pending, closed) = (pending.clone(), closed.clone());
            tokio::spawn(async move {
                loop {
                    let (fh, header, payload) = match read_frame(&mut rd).await {
                        Ok(x) => x,
                        Err(_) => break,
                    };
                    let Ok(msg) = decode(&fh, &header) else { break };
                    let mut p = pending.lock().expect("pending lock");
                    let tx = if fh.more() {
                        p.get(&fh.request_id).cloned()
                    } else {
                        p.remove(&fh.request_id)
                    };
                    drop(p);
                    if let Some(tx) = tx {
                        let _ = tx.send(Frame { msg, payload });
                    }
                }
                closed.store(true, Ordering::SeqCst);
                // Waiters see their channel close: a connection error.
                pending.lock().expect("pending lock").clear();
            })
        };
        Ok(Conn {
            shard: hello.shard_id as usize,
            writer: tokio::sync::Mutex::new(wr),
            pending,
            next_id: AtomicU64::new(2),
            closed,
            hello,
            reader,
        })
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Registers a request id and sends its first frame.
    pub(crate) async fn start(
        &self,
        req: &Request,
        payload: &[u8],
        more: bool,
    ) -> Result<(u64, mpsc::UnboundedReceiver<Frame>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.pending.lock().expect("pending lock").insert(id, tx);
        if let Err(e) = self
            .send(req.kind(), id, &req.encode(), payload, more)
            .await
        {
            self.pending.lock().expect("pending lock").remove(&id);
            return Err(e);
        }
        Ok((id, rx))
    }

    pub(crate) async fn send(
        &self,
        kind: Kind,
        id: u64,
        header: &[u8],
        payload: &[u8],
        more: bool,
    ) -> Result<()> {
        let mut frame = proto::frame(kind, id, more, header, payload.len());
        let mut w = self.writer.lock().await;
        let r = if payload.len() <= 64 * 1024 {
            frame.extend_from_slice(payload);
            w.write_all(&frame).await
        } else {
            match w.write_all(&frame).await {
                Ok(()) => w.write_all(payload).await,
                Err(e) => Err(e),
            }
        };
        r.map_err(|e| Error::Io(e, self.shard))
    }
}
