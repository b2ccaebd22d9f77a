//! A power-loss model of the store's file layer, for tests (TigerBeetle's
//! simulated storage and redb's crash-injecting backend are the models).
//!
//! The store runs on real files in buffered mode; every write, truncate and
//! sync of a segment file, and every directory entry the store creates,
//! renames or removes, is reported here *after* the real call succeeded.
//! The model keeps, per file, its bytes as of its last completed sync and
//! the writes and truncates since, in order; and per directory, its entries
//! as of its last fsync and the entry changes since, in order. What the
//! running process reads comes from the real files (the page cache), as in
//! production.
//!
//! `power_cut` then builds what a disk could hold after losing power at that
//! moment, in a new directory:
//! * each directory keeps its synced entries plus an arbitrary subset of the
//!   changes since (applied in order): a created file may vanish, an
//!   unlinked one may come back, a rename may or may not have happened;
//! * each file keeps its synced bytes plus an arbitrary subset of the
//!   sectors (512 B or 4 KiB, per cut) of each write since its last sync, so
//!   a write can be torn at any sector boundary; an unsynced truncate may or
//!   may not have happened; the size may or may not have been extended to
//!   cover writes whose sectors were lost (they read as zeros);
//! * nothing else: an fsync that the store skipped leaves its writes to
//!   chance, and so does a directory fsync it skipped.
//!
//! The cut happens at a chosen event (`cut_at_event`) or when the test
//! calls `cut_now`; from then on every operation reported here fails with
//! EIO (power is gone), so nothing the store acknowledges afterwards could
//! have been durable. The model is seeded and deterministic given the same
//! sequence of events.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    Truncate(u64),
}

#[derive(Debug, Default, Clone)]
struct Inode {
    /// The bytes a completed sync made durable.
    synced: Vec<u8>,
    /// Writes and truncates not yet covered by a completed sync, in order.
    pending: Vec<Op>,
    /// How many ops, counted from the file's creation, syncs have covered
    /// (`pending[0]` is op number `covered`).
    covered: u64,
}

#[derive(Debug, Clone)]
enum DirChange {
    Link(String, u64),
    Unlink(String),
    /// One change on disk: both names move together.
    Rename(String, String, u64),
}

#[derive(Debug, Default)]
struct Dir {
    /// Entries as the directory's last fsync left them.
    synced: BTreeMap<String, u64>,
    /// Entry changes since then, in order.
    pending: Vec<DirChange>,
    /// Entries as the running process sees them.
    live: BTreeMap<String, u64>,
}

/// Counts of what the model saw, for test reports and for tests that must
/// prove a phase was reached.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimStats {
    pub events: u64,
    pub writes: u64,
    pub file_syncs: u64,
    pub dir_syncs: u64,
    pub creates: u64,
    pub unlinks: u64,
    pub renames: u64,
    pub truncates: u64,
}

/// Which writes a sync covers (see `SimDisk::sync_begin`).
#[derive(Debug, Clone, Copy)]
pub struct SyncToken(u64);

/// What a power cut left: per file name, its bytes.
#[derive(Debug, Default, Clone)]
pub struct CutImage {
    pub files: BTreeMap<String, Vec<u8>>,
    /// Unsynced sectors kept and dropped, unsynced directory changes kept
    /// and dropped (how much chance the cut had to play with).
    pub sectors_kept: u64,
    pub sectors_dropped: u64,
    pub dir_changes_kept: u64,
    pub dir_changes_dropped: u64,
}

impl CutImage {
    /// Writes the image into `dir` (created if missing; must be empty).
    pub fn write_to(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, bytes) in &self.files {
            std::fs::write(dir.join(name), bytes)?;
        }
        Ok(())
    }
}

struct State {
    inodes: HashMap<u64, Inode>,
    dirs: BTreeMap<PathBuf, Dir>,
    next_ino: u64,
    stats: SimStats,
    cut_at_event: Option<u64>,
    /// (unlinks, events): power goes out `events` events after the
    /// `unlinks`th unlink (a compaction's delete), unless it went before.
    cut_after_unlink: Option<(u64, u64)>,
    rng: StdRng,
    image: Option<CutImage>,
}

/// The model; share it (`Rc`) between the store's configuration and the
/// test.
pub struct SimDisk {
    state: RefCell<State>,
}

fn power_gone() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("path without a directory"))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::other("path without a UTF-8 file name"))?;
    Ok((dir.to_path_buf(), name.to_string()))
}

impl SimDisk {
    /// A model whose synced state is what `dir` holds now (every file in it
    /// durable, as after a clean shutdown or a previous cut's image).
    /// `seed` drives every choice a power cut makes.
    pub fn adopt(dir: &Path, seed: u64) -> io::Result<Rc<SimDisk>> {
        let mut state = State {
            inodes: HashMap::new(),
            dirs: BTreeMap::new(),
            next_ino: 1,
            stats: SimStats::default(),
            cut_at_event: None,
            cut_after_unlink: None,
            rng: StdRng::seed_from_u64(seed),
            image: None,
        };
        let mut d = Dir::default();
        let mut names: Vec<String> = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if e.file_type()?.is_file() {
                if let Some(n) = e.file_name().to_str() {
                    names.push(n.to_string());
                }
            }
        }
        names.sort();
        for name in names {
            let ino = state.next_ino;
            state.next_ino += 1;
            let synced = std::fs::read(dir.join(&name))?;
            state.inodes.insert(
                ino,
                Inode {
                    synced,
                    pending: Vec::new(),
                    covered: 0,
                },
            );
            d.synced.insert(name.clone(), ino);
            d.live.insert(name, ino);
        }
        state.dirs.insert(dir.to_path_buf(), d);
        Ok(Rc::new(SimDisk {
            state: RefCell::new(state),
        }))
    }

    /// Power goes out when the `n`th event from now (1 = the next one) is
    /// reported: that operation fails, and so does everything after it.
    pub fn cut_at_event(&self, n: u64) {
        let mut st = self.state.borrow_mut();
        st.cut_at_event = Some(st.stats.events + n.max(1));
    }

    /// Power goes out `events` events after the `unlinks`th unlink from now
    /// (windows where a compaction has deleted a segment), or at the event
    /// `cut_at_event` chose, whichever comes first.
    pub fn cut_after_unlinks(&self, unlinks: u64, events: u64) {
        let mut st = self.state.borrow_mut();
        st.cut_after_unlink = Some((st.stats.unlinks + unlinks.max(1), events.max(1)));
    }

    /// Power goes out now (if it has not already).
    pub fn cut_now(&self) {
        let mut st = self.state.borrow_mut();
        if st.image.is_none() {
            let image = st.build_image();
            st.image = Some(image);
        }
    }

    pub fn is_cut(&self) -> bool {
        self.state.borrow().image.is_some()
    }

    /// What the cut left (cutting now if power is still on).
    pub fn image(&self) -> CutImage {
        self.cut_now();
        self.state.borrow().image.clone().expect("cut")
    }

    pub fn stats(&self) -> SimStats {
        self.state.borrow().stats
    }

    /// Reports an event: fails if power is gone, or goes out with it.
    fn event(&self, apply: impl FnOnce(&mut State) -> io::Result<()>) -> io::Result<()> {
        let mut st = self.state.borrow_mut();
        if st.image.is_some() {
            return Err(power_gone());
        }
        st.stats.events += 1;
        if st.cut_at_event.is_some_and(|at| st.stats.events >= at) {
            let image = st.build_image();
            st.image = Some(image);
            return Err(power_gone());
        }
        apply(&mut st)
    }

    /// Fails if power is gone (checked before a real operation).
    pub fn check(&self) -> io::Result<()> {
        if self.is_cut() {
            Err(power_gone())
        } else {
            Ok(())
        }
    }

    /// A file was created at `path` (the real file exists now).
    pub fn created(&self, path: &Path) -> io::Result<u64> {
        let (dir, name) = split(path)?;
        let mut ino = 0;
        self.event(|st| {
            ino = st.next_ino;
            st.next_ino += 1;
            st.inodes.insert(ino, Inode::default());
            st.stats.creates += 1;
            let d = st.dirs.entry(dir).or_default();
            d.live.insert(name.clone(), ino);
            d.pending.push(DirChange::Link(name, ino));
            Ok(())
        })?;
        Ok(ino)
    }

    /// The inode an existing file at `path` has in the model.
    pub fn lookup(&self, path: &Path) -> io::Result<u64> {
        let (dir, name) = split(path)?;
        let st = self.state.borrow();
        st.dirs
            .get(&dir)
            .and_then(|d| d.live.get(&name))
            .copied()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    pub fn unlinked(&self, path: &Path) -> io::Result<()> {
        let (dir, name) = split(path)?;
        self.event(|st| {
            st.stats.unlinks += 1;
            if let Some((at, events)) = st.cut_after_unlink {
                if st.stats.unlinks == at {
                    let when = st.stats.events + events;
                    st.cut_at_event = Some(st.cut_at_event.map_or(when, |c| c.min(when)));
                }
            }
            let d = st.dirs.entry(dir).or_default();
            d.live.remove(&name);
            d.pending.push(DirChange::Unlink(name));
            Ok(())
        })
    }

    pub fn renamed(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_dir, from_name) = split(from)?;
        let (to_dir, to_name) = split(to)?;
        if from_dir != to_dir {
            return Err(io::Error::other("the model renames within a directory"));
        }
        self.event(|st| {
            st.stats.renames += 1;
            let d = st.dirs.entry(from_dir).or_default();
            let ino = d
                .live
                .remove(&from_name)
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
            d.live.insert(to_name.clone(), ino);
            d.pending.push(DirChange::Rename(from_name, to_name, ino));
            Ok(())
        })
    }

    pub fn dir_synced(&self, dir: &Path) -> io::Result<()> {
        self.event(|st| {
            st.stats.dir_syncs += 1;
            let d = st.dirs.entry(dir.to_path_buf()).or_default();
            d.synced = d.live.clone();
            d.pending.clear();
            Ok(())
        })
    }

    pub fn wrote(&self, ino: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        self.event(|st| {
            st.stats.writes += 1;
            inode(st, ino)?.pending.push(Op::Write {
                offset,
                data: data.to_vec(),
            });
            Ok(())
        })
    }

    pub fn truncated(&self, ino: u64, len_bytes: u64) -> io::Result<()> {
        self.event(|st| {
            st.stats.truncates += 1;
            inode(st, ino)?.pending.push(Op::Truncate(len_bytes));
            Ok(())
        })
    }

    /// A sync of `ino` starts: what it will make durable is what was
    /// written before now (a write that completes while the sync runs may
    /// or may not be covered, so the model takes it as not covered).
    pub fn sync_begin(&self, ino: u64) -> SyncToken {
        let st = self.state.borrow();
        SyncToken(
            st.inodes
                .get(&ino)
                .map_or(0, |n| n.covered + n.pending.len() as u64),
        )
    }

    /// The sync that `token` started completed.
    pub fn synced(&self, ino: u64, token: SyncToken) -> io::Result<()> {
        self.event(|st| {
            st.stats.file_syncs += 1;
            let node = inode(st, ino)?;
            // Syncs may complete out of order: this one covers the ops up
            // to its token, some of which a later-started one that
            // completed first may already have covered.
            let n = (token.0.saturating_sub(node.covered) as usize).min(node.pending.len());
            let now_covered: Vec<Op> = node.pending.drain(..n).collect();
            for op in &now_covered {
                apply(&mut node.synced, op);
            }
            node.covered += n as u64;
            Ok(())
        })
    }

    /// Writes a small file durably the way the store does (temporary file,
    /// write, fsync, rename, directory fsync), on real files and in the
    /// model.
    pub fn write_file_durably(&self, dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        self.check()?;
        let tmp = dir.join(format!("{name}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        let ino = match self.lookup(&tmp) {
            // A leftover temporary file: File::create truncated it.
            Ok(ino) => {
                self.truncated(ino, 0)?;
                ino
            }
            Err(_) => self.created(&tmp)?,
        };
        f.write_all(bytes)?;
        self.wrote(ino, 0, bytes)?;
        let token = self.sync_begin(ino);
        f.sync_all()?;
        self.synced(ino, token)?;
        std::fs::rename(&tmp, dir.join(name))?;
        self.renamed(&tmp, &dir.join(name))?;
        super::file::sync_dir_real(dir)?;
        self.dir_synced(dir)
    }
}

fn inode(st: &mut State, ino: u64) -> io::Result<&mut Inode> {
    st.inodes
        .get_mut(&ino)
        .ok_or_else(|| io::Error::other(format!("inode {ino} unknown to the model")))
}

fn apply(bytes: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { offset, data } => {
            let end = *offset as usize + data.len();
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[*offset as usize..end].copy_from_slice(data);
        }
        Op::Truncate(len) => bytes.resize(*len as usize, 0),
    }
}

impl State {
    fn build_image(&mut self) -> CutImage {
        let mut image = CutImage::default();
        let sector: u64 = if self.rng.gen_bool(0.5) { 512 } else { 4096 };
        // How likely an unsynced sector or directory change is to have
        // reached the disk: all, none, or anything in between.
        let p_sector = [0.0, 1.0, 0.5, self.rng.gen_range(0.05..0.95)][self.rng.gen_range(0..4)];
        let p_dir = [0.0, 1.0, 0.5][self.rng.gen_range(0..3)];
        let mut names: BTreeMap<String, u64> = BTreeMap::new();
        for d in self.dirs.values() {
            let mut entries = d.synced.clone();
            for c in &d.pending {
                if !self.rng.gen_bool(p_dir) {
                    image.dir_changes_dropped += 1;
                    continue;
                }
                image.dir_changes_kept += 1;
                match c {
                    DirChange::Link(name, ino) => {
                        entries.insert(name.clone(), *ino);
                    }
                    DirChange::Unlink(name) => {
                        entries.remove(name);
                    }
                    DirChange::Rename(from, to, ino) => {
                        if entries.get(from) == Some(ino) {
                            entries.remove(from);
                        }
                        entries.insert(to.clone(), *ino);
                    }
                }
            }
            names.extend(entries);
        }
        let mut contents: HashMap<u64, Vec<u8>> = HashMap::new();
        for (name, ino) in names {
            if let std::collections::hash_map::Entry::Vacant(slot) = contents.entry(ino) {
                let node = self.inodes.get(&ino).cloned().unwrap_or_default();
                slot.insert(self.surviving_bytes(&node, sector, p_sector, &mut image));
            }
            image.files.insert(name, contents[&ino].clone());
        }
        image
    }

    fn surviving_bytes(
        &mut self,
        node: &Inode,
        sector: u64,
        p: f64,
        image: &mut CutImage,
    ) -> Vec<u8> {
        let mut bytes = node.synced.clone();
        // The size the running process saw, for a size update that reached
        // the disk ahead of the data.
        let mut live = node.synced.clone();
        for op in &node.pending {
            apply(&mut live, op);
            match op {
                Op::Truncate(_) => {
                    if self.rng.gen_bool(0.5) {
                        apply(&mut bytes, op);
                    }
                }
                Op::Write { offset, data } => {
                    let end = offset + data.len() as u64;
                    let mut at = *offset;
                    while at < end {
                        let next = ((at / sector) + 1) * sector;
                        let piece_end = next.min(end);
                        if self.rng.gen_bool(p) {
                            image.sectors_kept += 1;
                            let from = (at - offset) as usize;
                            let to = (piece_end - offset) as usize;
                            apply(
                                &mut bytes,
                                &Op::Write {
                                    offset: at,
                                    data: data[from..to].to_vec(),
                                },
                            );
                        } else {
                            image.sectors_dropped += 1;
                        }
                        at = piece_end;
                    }
                }
            }
        }
        // A size update may have reached the disk ahead of the data: the
        // file may end at any unsynced write's end, the missing bytes
        // reading as zeros.
        if self.rng.gen_bool(0.5) {
            let ends: Vec<u64> = node
                .pending
                .iter()
                .filter_map(|op| match op {
                    Op::Write { offset, data } => Some(offset + data.len() as u64),
                    Op::Truncate(_) => None,
                })
                .filter(|end| *end as usize > bytes.len() && *end as usize <= live.len())
                .collect();
            if !ends.is_empty() {
                let end = ends[self.rng.gen_range(0..ends.len())];
                bytes.resize(end as usize, 0);
            }
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two syncs in flight on one file, completing out of order: each
    /// covers only what was written before it started.
    #[test]
    fn overlapping_syncs_cover_only_what_preceded_them() {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimDisk::adopt(dir.path(), 1).unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"").unwrap();
        let ino = sim.created(&path).unwrap();
        sim.dir_synced(dir.path()).unwrap();
        sim.wrote(ino, 0, &[1; 512]).unwrap();
        let a = sim.sync_begin(ino);
        sim.wrote(ino, 512, &[2; 512]).unwrap();
        let b = sim.sync_begin(ino);
        sim.synced(ino, b).unwrap();
        sim.wrote(ino, 1024, &[3; 512]).unwrap();
        // A completes last: it must not cover the write made after B began.
        sim.synced(ino, a).unwrap();
        let st = sim.state.borrow();
        let node = &st.inodes[&ino];
        assert_eq!(node.synced.len(), 1024);
        assert_eq!(node.pending.len(), 1);
        assert_eq!(node.covered, 2);
    }

    /// With every unsynced sector and directory change dropped, only what
    /// was synced survives a cut.
    #[test]
    fn a_cut_keeps_what_was_synced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old"), b"durable").unwrap();
        let sim = SimDisk::adopt(dir.path(), 7).unwrap();
        let path = dir.path().join("new");
        std::fs::write(&path, b"").unwrap();
        let ino = sim.created(&path).unwrap();
        sim.wrote(ino, 0, &[9; 4096]).unwrap();
        let t = sim.sync_begin(ino);
        sim.synced(ino, t).unwrap();
        // The new name was never made durable: it may or may not survive,
        // but "old" always does, with its bytes.
        let image = sim.image();
        assert_eq!(
            image.files.get("old").map(|b| &b[..]),
            Some(&b"durable"[..])
        );
        if let Some(b) = image.files.get("new") {
            assert_eq!(b, &vec![9u8; 4096]);
        }
        assert!(sim.check().is_err(), "power stays off after the cut");
    }
}
