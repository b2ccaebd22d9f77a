//! Segment file I/O: O_DIRECT through glommio's DMA files, or buffered I/O
//! where the filesystem refuses O_DIRECT. A fault hook lets tests inject
//! errors deterministically.

use std::cell::RefCell;
use std::io;
use std::path::Path;
use std::rc::Rc;

use glommio::io::{BufferedFile, DmaBuffer, DmaFile, OpenOptions, ReadResult};

use super::sim::SimDisk;

/// Alignment of every write offset and length (O_DIRECT, and so that a
/// torn write never touches a block holding acknowledged data).
pub const WRITE_ALIGN_BYTES: u64 = 4096;

/// A point where the store performs I/O, for fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    Create {
        segment_id: u64,
    },
    Write {
        segment_id: u64,
        offset: u64,
        len_bytes: u64,
    },
    Sync {
        segment_id: u64,
    },
    /// The write of a Seal record (when a segment is full, at shutdown, or
    /// when recovery closes a segment).
    Seal {
        segment_id: u64,
        offset: u64,
    },
    Read {
        segment_id: u64,
        offset: u64,
    },
}

/// A fault for a `FaultPoint::Write` of a batch: the first `bytes` of the
/// write reach the file, the rest is zeros (`garbage: false`) or a fixed
/// junk pattern (`garbage: true`), and the write then fails with EIO: what a
/// crash or a device error in the middle of a write leaves behind. With
/// `short: true` it is a short write instead: the write stops after `bytes`
/// (rounded down to `WRITE_ALIGN_BYTES`, as O_DIRECT would), nothing beyond
/// reaches the file (which may end there), and the store sees the byte count
/// come back short. Return it from the hook as
/// `io::Error::other(TornWrite { .. })`; at other points it is an ordinary
/// error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornWrite {
    pub bytes: u64,
    pub garbage: bool,
    pub short: bool,
}

impl std::fmt::Display for TornWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.short { "short" } else { "torn" };
        write!(f, "{what} write after {} bytes (injected)", self.bytes)
    }
}

impl std::error::Error for TornWrite {}

impl TornWrite {
    /// The torn-write fault carried by an injected error, if it is one.
    pub fn of(e: &io::Error) -> Option<TornWrite> {
        e.get_ref()?.downcast_ref::<TornWrite>().copied()
    }
}

/// Returns `Some(error)` to make that I/O fail.
pub type FaultHook = Rc<RefCell<dyn FnMut(FaultPoint) -> Option<io::Error>>>;

pub enum SegFile {
    /// An O_DIRECT file, and its slot in the shard ring's registered-file
    /// table once it has been used there.
    Direct(DmaFile, FixedSlot),
    Buffered(BufferedFile),
    /// A buffered file whose writes, truncates and syncs are reported to a
    /// power-loss model (tests; see `sim`).
    Sim(BufferedFile, Rc<SimDisk>, u64),
}

/// Where segment files and the store's directory entries live: the real
/// file system, or the real file system watched by a power-loss model.
#[derive(Clone, Default)]
pub enum Disk {
    #[default]
    Real,
    Sim(Rc<SimDisk>),
}

impl Disk {
    /// Creates a new segment file (the name must not exist).
    pub async fn create(&self, path: &Path, direct: bool) -> io::Result<SegFile> {
        match self {
            Disk::Real => SegFile::create(path, direct).await,
            Disk::Sim(sim) => {
                sim.check()?;
                let mut opts = OpenOptions::new();
                opts.read(true).write(true).create_new(true);
                let f = opts.buffered_open(path).await.map_err(glommio_err)?;
                let ino = sim.created(path)?;
                Ok(SegFile::Sim(f, sim.clone(), ino))
            }
        }
    }

    /// Opens an existing segment file.
    pub async fn open(&self, path: &Path, direct: bool) -> io::Result<SegFile> {
        match self {
            Disk::Real => SegFile::open(path, direct).await,
            Disk::Sim(sim) => {
                sim.check()?;
                let ino = sim.lookup(path)?;
                let mut opts = OpenOptions::new();
                opts.read(true).write(true);
                let f = opts.buffered_open(path).await.map_err(glommio_err)?;
                Ok(SegFile::Sim(f, sim.clone(), ino))
            }
        }
    }

    pub fn remove_file(&self, path: &Path) -> io::Result<()> {
        if let Disk::Sim(sim) = self {
            sim.check()?;
        }
        std::fs::remove_file(path)?;
        match self {
            Disk::Real => Ok(()),
            Disk::Sim(sim) => sim.unlinked(path),
        }
    }

    /// Makes a directory entry change (create, unlink, rename) durable.
    pub fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if let Disk::Sim(sim) = self {
            sim.check()?;
        }
        sync_dir_real(dir)?;
        match self {
            Disk::Real => Ok(()),
            Disk::Sim(sim) => sim.dir_synced(dir),
        }
    }

    /// Writes a small file durably: temporary file, fsync, rename, fsync of
    /// the directory.
    pub fn write_file_durably(&self, dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
        match self {
            Disk::Real => {
                use std::io::Write;
                let tmp = dir.join(format!("{name}.tmp"));
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(bytes)?;
                f.sync_all()?;
                std::fs::rename(&tmp, dir.join(name))?;
                sync_dir_real(dir)
            }
            Disk::Sim(sim) => sim.write_file_durably(dir, name, bytes),
        }
    }
}

/// A registered-file slot; freed when the segment file is dropped, so a
/// slot never outlives its file (a later file could reuse the descriptor
/// number, never the slot).
#[derive(Default)]
pub struct FixedSlot(std::cell::RefCell<Option<(std::rc::Weak<crate::ring::DataRing>, u32)>>);

impl Drop for FixedSlot {
    fn drop(&mut self) {
        if let Some((ring, slot)) = self.0.borrow_mut().take() {
            if let Some(ring) = ring.upgrade() {
                ring.unregister_file(slot);
            }
        }
    }
}

/// A buffer suited to the file's write path.
pub enum WriteBuf {
    Dma(DmaBuffer),
    Heap(Vec<u8>),
    /// A registered buffer of the shard's data ring (WRITE_FIXED).
    Pool(crate::ring::PoolBuf),
}

impl WriteBuf {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            WriteBuf::Dma(b) => b.as_bytes_mut(),
            WriteBuf::Heap(v) => v.as_mut_slice(),
            WriteBuf::Pool(b) => {
                let len = b.len();
                &mut b.as_mut_capacity()[..len]
            }
        }
    }

    /// Cuts the buffer to its first `len_bytes` (a multiple of
    /// `WRITE_ALIGN_BYTES` for O_DIRECT files).
    pub fn truncate(&mut self, len_bytes: usize) {
        match self {
            WriteBuf::Dma(b) => b.trim_to_size(len_bytes.min(b.len())),
            WriteBuf::Heap(v) => v.truncate(len_bytes),
            WriteBuf::Pool(b) => b.set_len(len_bytes.min(b.len())),
        }
    }

    /// A zero-filled registered buffer of `len_bytes`.
    pub fn pool(mut b: crate::ring::PoolBuf, len_bytes: usize) -> WriteBuf {
        assert!(len_bytes <= b.capacity());
        b.as_mut_capacity()[..len_bytes].fill(0);
        b.set_len(len_bytes);
        WriteBuf::Pool(b)
    }
}

fn glommio_err<T>(e: glommio::GlommioError<T>) -> io::Error {
    e.into()
}

impl SegFile {
    /// The file descriptor of an O_DIRECT segment, for reads on the
    /// shard's own data ring; None for buffered files.
    /// How the data ring should name this file: its registered slot
    /// (registered on first use), else its descriptor.
    pub fn ring_target(&self, ring: &crate::ring::DataRing) -> Option<crate::ring::FileRef> {
        let SegFile::Direct(f, slot) = self else {
            return None;
        };
        if let Some((r, s)) = &*slot.0.borrow() {
            if std::rc::Weak::ptr_eq(r, &ring.weak()) {
                return Some(crate::ring::FileRef::Fixed(*s));
            }
        }
        let fd = std::os::fd::AsRawFd::as_raw_fd(f);
        if slot.0.borrow().is_none() {
            if let Some(s) = ring.register_file(fd) {
                *slot.0.borrow_mut() = Some((ring.weak(), s));
                return Some(crate::ring::FileRef::Fixed(s));
            }
        }
        Some(crate::ring::FileRef::Raw(fd))
    }

    pub fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        match self {
            SegFile::Direct(f, _) => Some(std::os::fd::AsRawFd::as_raw_fd(f)),
            SegFile::Buffered(_) | SegFile::Sim(..) => None,
        }
    }

    pub async fn create(path: &Path, direct: bool) -> io::Result<SegFile> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create_new(true);
        Self::open_with(path, direct, &opts).await
    }

    pub async fn open(path: &Path, direct: bool) -> io::Result<SegFile> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        Self::open_with(path, direct, &opts).await
    }

    async fn open_with(path: &Path, direct: bool, opts: &OpenOptions) -> io::Result<SegFile> {
        if direct {
            Ok(SegFile::Direct(
                opts.dma_open(path).await.map_err(glommio_err)?,
                FixedSlot::default(),
            ))
        } else {
            Ok(SegFile::Buffered(
                opts.buffered_open(path).await.map_err(glommio_err)?,
            ))
        }
    }

    pub fn alloc_write_buf(&self, len_bytes: usize) -> WriteBuf {
        debug_assert_eq!(len_bytes as u64 % WRITE_ALIGN_BYTES, 0);
        match self {
            SegFile::Direct(f, _) => {
                let mut b = f.alloc_dma_buffer(len_bytes);
                b.as_bytes_mut().fill(0);
                WriteBuf::Dma(b)
            }
            SegFile::Buffered(_) | SegFile::Sim(..) => WriteBuf::Heap(vec![0u8; len_bytes]),
        }
    }

    /// Writes the whole buffer at `offset`; a short write is an error.
    pub async fn write_at(&self, buf: WriteBuf, offset: u64) -> io::Result<()> {
        debug_assert_eq!(offset % WRITE_ALIGN_BYTES, 0);
        let (written, expected) = match (self, buf) {
            (SegFile::Direct(f, _), WriteBuf::Dma(b)) => {
                let expected = b.len();
                (f.write_at(b, offset).await.map_err(glommio_err)?, expected)
            }
            (SegFile::Buffered(f), WriteBuf::Heap(v)) => {
                let expected = v.len();
                (f.write_at(v, offset).await.map_err(glommio_err)?, expected)
            }
            (SegFile::Sim(f, sim, ino), WriteBuf::Heap(v)) => {
                sim.check()?;
                let expected = v.len();
                let copy = v.clone();
                let written = f.write_at(v, offset).await.map_err(glommio_err)?;
                sim.wrote(*ino, offset, &copy[..written.min(expected)])?;
                (written, expected)
            }
            _ => return Err(io::Error::other("write buffer does not match file mode")),
        };
        if written != expected {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {written} of {expected} bytes"),
            ));
        }
        Ok(())
    }

    /// Reads `len_bytes` at any offset; fewer bytes come back at end of file.
    pub async fn read_at(&self, offset: u64, len_bytes: usize) -> io::Result<ReadResult> {
        match self {
            SegFile::Direct(f, _) => f.read_at(offset, len_bytes).await.map_err(glommio_err),
            SegFile::Buffered(f) | SegFile::Sim(f, ..) => {
                f.read_at(offset, len_bytes).await.map_err(glommio_err)
            }
        }
    }

    pub async fn sync(&self) -> io::Result<()> {
        match self {
            SegFile::Direct(f, _) => f.fdatasync().await.map_err(glommio_err),
            SegFile::Buffered(f) => f.fdatasync().await.map_err(glommio_err),
            SegFile::Sim(f, sim, ino) => {
                sim.check()?;
                let token = sim.sync_begin(*ino);
                f.fdatasync().await.map_err(glommio_err)?;
                sim.synced(*ino, token)
            }
        }
    }

    pub async fn truncate(&self, len_bytes: u64) -> io::Result<()> {
        match self {
            SegFile::Direct(f, _) => f.truncate(len_bytes).await.map_err(glommio_err),
            SegFile::Buffered(f) => f.truncate(len_bytes).await.map_err(glommio_err),
            SegFile::Sim(f, sim, ino) => {
                sim.check()?;
                f.truncate(len_bytes).await.map_err(glommio_err)?;
                sim.truncated(*ino, len_bytes)
            }
        }
    }

    pub async fn size_bytes(&self) -> io::Result<u64> {
        match self {
            SegFile::Direct(f, _) => f.file_size().await.map_err(glommio_err),
            SegFile::Buffered(f) | SegFile::Sim(f, ..) => f.file_size().await.map_err(glommio_err),
        }
    }
}

/// glommio decides per device and per thread whether reads may use the
/// io_uring poll ring by reading the first block of the first DMA file opened
/// there. On an empty file that read "succeeds" with 0 bytes, polling gets
/// enabled, and every later read fails with EOPNOTSUPP on devices without
/// poll queues (virtio disks). Opening a non-empty file first makes the probe
/// real. Call once per executor thread before any other DMA file is opened.
pub async fn prime_iopoll_probe(dir: &Path) -> io::Result<()> {
    let path = dir.join(format!(".percore-iopoll-probe-{}", std::process::id()));
    std::fs::write(&path, [0u8; 4096])?;
    let opened = DmaFile::open(&path).await.map_err(glommio_err);
    let _ = std::fs::remove_file(&path);
    opened?.close().await.map_err(glommio_err)
}

/// Makes a directory entry change (create, unlink) durable. The store goes
/// through `Disk::sync_dir`, which the power-loss model watches.
pub fn sync_dir_real(path: &Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Does this directory's filesystem accept O_DIRECT? Probed with a real file.
pub fn probe_direct_io(dir: &Path) -> io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(".percore-odirect-probe");
    let result = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = std::fs::remove_file(&probe);
    match result {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}
