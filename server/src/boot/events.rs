//! How the main thread and the shards talk during start-up and shutdown:
//! shards report over a channel (`Event`), the main thread wakes every
//! shard through an eventfd (drain, then stop).

use std::os::fd::{FromRawFd, RawFd};

/// What shards tell the main thread (start-up and shutdown only).
pub enum Event {
    Ready(usize),
    Failed(usize, String),
    Drained(usize),
}

/// An eventfd the main thread signals and a shard task waits on. Never
/// closed: it lives as long as the process (one per shard and phase).
pub struct Eventfd(pub RawFd);

impl Eventfd {
    pub fn new() -> std::io::Result<Eventfd> {
        // SAFETY: eventfd takes no pointers; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Eventfd(fd))
    }

    /// One eventfd per shard.
    pub fn per_shard(n: usize) -> Result<Vec<Eventfd>, String> {
        (0..n)
            .map(|_| Eventfd::new())
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())
    }

    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, a live u64, to our eventfd.
        unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
    }
}

/// Parks the calling glommio task until `fd` (an eventfd) is signalled.
pub async fn wait_eventfd(fd: RawFd) {
    // SAFETY: `fd` is an open eventfd (never closed); dup takes no pointers.
    let dup = unsafe { libc::dup(fd) };
    // SAFETY: `dup` is a fresh descriptor that only this file owns and closes.
    let file = unsafe { glommio::io::BufferedFile::from_raw_fd(dup) };
    let _ = file.read_at(0, 8).await;
    let _ = file.close().await;
}
