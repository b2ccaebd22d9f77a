//! The listening side of the front doors: binding the native listeners (the
//! S3 group is bound by `steer`), and the one accept loop that every front
//! door (S3, native, admin) runs on its shard, with the per-protocol part
//! passed in as a closure.

use std::cell::Cell;
use std::future::Future;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::Duration;

use glommio::net::{TcpListener, TcpStream};

use crate::metrics::ShardMetrics;
use crate::shard::Shard;

/// A per-shard bound on one front door's open connections: past it a new
/// connection is closed at once (clients retry), so the shard keeps serving
/// the others.
pub struct ConnLimit {
    pub shard: Rc<Shard>,
    pub conns_max: u64,
    /// The door's accepted-connections counter.
    pub accepted: fn(&ShardMetrics) -> &Cell<u64>,
    /// The door's open-connections gauge.
    pub open: fn(&ShardMetrics) -> &Cell<u64>,
}

/// One front door's accept loop.
pub struct Door {
    /// For log lines: "S3", "native", "admin".
    pub name: &'static str,
    pub shard: usize,
    /// None: unbounded, and the loop ends at the first accept error (admin).
    /// Some: bounded, and an accept error pauses the loop for 10 ms.
    pub limit: Option<ConnLimit>,
}

/// Adopts a listening socket bound in the main thread.
///
/// # Safety
/// `fd` must be an open listening TCP socket that nothing else owns or
/// closes: the listener closes it when dropped.
pub unsafe fn adopt(fd: RawFd) -> TcpListener {
    // SAFETY: the caller hands over sole ownership of a listening socket.
    unsafe { <TcpListener as std::os::fd::FromRawFd>::from_raw_fd(fd) }
}

/// Accepts connections on `listener` and serves each in its own task with
/// `serve`, until the returned task is dropped (drain) or, for an unbounded
/// door, accepting fails.
pub fn spawn_accept_loop<F, Fut>(listener: TcpListener, door: Door, serve: F) -> glommio::Task<()>
where
    F: Fn(TcpStream) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    glommio::spawn_local(async move {
        loop {
            match listener.accept().await {
                Ok(stream) => {
                    if door.admit() {
                        glommio::spawn_local(serve(stream)).detach();
                    }
                }
                Err(e) if door.limit.is_some() => {
                    tracing::warn!(shard = door.shard, "{} accept failed: {e}", door.name);
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
                Err(_) => break,
            }
        }
    })
}

impl Door {
    /// Counts an accepted connection; false when it is over the limit (the
    /// caller then drops it, which closes it).
    fn admit(&self) -> bool {
        let Some(limit) = &self.limit else {
            return true;
        };
        let m = limit.shard.metrics();
        let accepted = (limit.accepted)(m);
        accepted.set(accepted.get() + 1);
        if (limit.open)(m).get() >= limit.conns_max {
            m.connections_refused.set(m.connections_refused.get() + 1);
            tracing::warn!(
                shard = self.shard,
                "{} connection limit {} reached (connections_per_shard_max); closing a new connection",
                self.name,
                limit.conns_max
            );
            return false;
        }
        true
    }
}

/// Binds one native-protocol listener per shard, in the main thread (so a
/// port in use fails start-up with a clear message): shard i on
/// `addr.port() + i`, or an ephemeral port each when `addr.port()` is 0.
pub fn bind_native(addr: std::net::SocketAddr, n: usize) -> Result<(Vec<RawFd>, Vec<u16>), String> {
    use std::os::fd::IntoRawFd;
    let mut fds = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    for i in 0..n {
        let port = if addr.port() == 0 {
            0
        } else {
            u16::try_from(usize::from(addr.port()) + i).map_err(|_| {
                format!(
                    "native port {} + shard {i} is past 65535; choose a lower --native port",
                    addr.port()
                )
            })?
        };
        let at = std::net::SocketAddr::new(addr.ip(), port);
        let l = std::net::TcpListener::bind(at).map_err(|e| {
            format!("cannot listen on {at} for the native protocol (shard {i}): {e}; choose another --native address (shard i uses port + i)")
        })?;
        ports.push(l.local_addr().map_err(|e| e.to_string())?.port());
        fds.push(l.into_raw_fd());
    }
    Ok((fds, ports))
}
