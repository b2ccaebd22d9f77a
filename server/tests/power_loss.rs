//! Power-loss property (issue 21 item 1): the store runs a concurrent
//! workload (PUTs of every size, overwrites, DELETEs, multipart uploads,
//! compaction and sealing in flight) on real files watched by the
//! power-loss model (`store::sim`); power goes out at a seeded event; what
//! the disk could hold then (synced bytes plus an arbitrary subset of the
//! unsynced sectors and directory changes) is recovered, sometimes with a
//! second power cut during recovery itself. After every recovery:
//! - every acknowledged operation survives: a key shows its last
//!   acknowledged version, or the version of the one operation that was in
//!   flight on it when power went out;
//! - nothing unacknowledged is half visible: an object is all of one
//!   version's bytes and metadata, or absent;
//! - no forged or resurrected record appears: never an older version, a
//!   deleted one, or bytes nobody wrote; reads never fail; listing shows
//!   exactly the keys a read finds.
//!
//! Seeds: `PERCORE_POWER_LOSS_SEEDS` (default 256) from
//! `PERCORE_POWER_LOSS_SEED_BASE` (default 0); lives per seed:
//! `PERCORE_POWER_LOSS_LIVES` (default 4). The long run is the same test
//! with more seeds.

// A test is one scenario read top to bottom; splitting it would hide the story.
#![allow(clippy::too_many_lines)]

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use percore_server::store::file::Disk;
use percore_server::store::mpu::PART_BYTES_MIN;
use percore_server::store::record::ObjectMeta;
use percore_server::store::sim::{SimDisk, SimStats};
use percore_server::store::{Store, StoreConfig, StoreError};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::{list_names, read_all, run, small_config};

const WORKERS: usize = 4;
const KEYS_PER_WORKER: usize = 5;
const KEYS: usize = WORKERS * KEYS_PER_WORKER;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn key_name(k: usize) -> String {
    format!("k/{k:02}")
}

/// The bytes of version `v` (versions are unique across the whole run).
fn payload(v: u64, len: usize) -> Bytes {
    common::seeded_bytes(v ^ 0x005E_ED0F_DA7A, len)
}

/// A version of a key: its number (also its content type, so metadata is
/// checked with the bytes) and its bytes.
type Version = Option<(u64, Bytes)>;

fn describe(v: &Version) -> String {
    v.as_ref().map_or("absent".into(), |(n, b)| {
        format!("v{n} ({} bytes)", b.len())
    })
}

#[derive(Clone, Default)]
struct KeyModel {
    acked: Version,
    /// The operation in flight when power went out, if any.
    in_flight: Option<Version>,
    history: Vec<String>,
}

#[derive(Default, Clone, Copy)]
struct Totals {
    acked: u64,
    in_flight: u64,
    in_flight_visible: u64,
    lives: u64,
    recovery_cuts: u64,
    compactions: u64,
    mpu_completed: u64,
    sectors_dropped: u64,
    sectors_kept: u64,
    dir_changes_dropped: u64,
    dir_changes_kept: u64,
    file_syncs: u64,
    dir_syncs: u64,
    unlinks: u64,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.acked += o.acked;
        self.in_flight += o.in_flight;
        self.in_flight_visible += o.in_flight_visible;
        self.lives += o.lives;
        self.recovery_cuts += o.recovery_cuts;
        self.compactions += o.compactions;
        self.mpu_completed += o.mpu_completed;
        self.sectors_dropped += o.sectors_dropped;
        self.sectors_kept += o.sectors_kept;
        self.dir_changes_dropped += o.dir_changes_dropped;
        self.dir_changes_kept += o.dir_changes_kept;
        self.file_syncs += o.file_syncs;
        self.dir_syncs += o.dir_syncs;
        self.unlinks += o.unlinks;
    }
}

fn config(dir: &Path, sim: &Rc<SimDisk>) -> StoreConfig {
    let mut cfg = small_config(dir);
    cfg.direct_io = false;
    cfg.disk = Disk::Sim(sim.clone());
    cfg
}

fn meta(v: u64) -> ObjectMeta {
    ObjectMeta {
        content_type: format!("v{v}"),
        ..Default::default()
    }
}

fn md5_hex(b: &[u8]) -> String {
    use md5::{Digest, Md5};
    hex::encode(Md5::digest(b))
}

/// One operation of a worker.
enum Plan {
    Delete,
    Put(Bytes),
    /// A multipart upload of these parts.
    Multipart(Vec<Bytes>),
}

impl Plan {
    /// `delete_pct`: how often the operation is a DELETE.
    fn draw(rng: &mut StdRng, v: u64, delete_pct: u32) -> Plan {
        if rng.gen_range(0..100) < delete_pct {
            return Plan::Delete;
        }
        match rng.gen_range(1..10) {
            1 => Plan::Put(payload(v, rng.gen_range(1..6000))),
            // One part of a few bytes to a few chunks; sometimes after a
            // part of the 5 MiB minimum (20 small segments).
            2 => {
                let mut parts = Vec::new();
                if rng.gen_range(0..4) == 0 {
                    parts.push(payload(v * 8, PART_BYTES_MIN as usize));
                }
                parts.push(payload(v * 8 + 1, rng.gen_range(1..40_000)));
                Plan::Multipart(parts)
            }
            _ => Plan::Put(payload(
                v,
                match rng.gen_range(0..10) {
                    0 => 0,
                    1..=5 => rng.gen_range(1..6000),
                    6..=8 => rng.gen_range(16 * 1024..90 * 1024),
                    // Larger than a segment.
                    _ => rng.gen_range(200 * 1024..400 * 1024),
                },
            )),
        }
    }

    /// What the key holds once the operation succeeded.
    fn target(&self, v: u64) -> Version {
        match self {
            Plan::Delete => None,
            Plan::Put(data) => Some((v, data.clone())),
            Plan::Multipart(parts) => Some((v, Bytes::from(parts.concat()))),
        }
    }

    async fn run(&self, store: &Store, key: &str, v: u64) -> Result<(), StoreError> {
        match self {
            Plan::Delete => store.delete("b", key).await.map(|_| ()),
            Plan::Put(data) => {
                let mut m = meta(v);
                m.etag = md5_hex(data);
                store.put("b", key, m, data.clone()).await.map(|_| ())
            }
            Plan::Multipart(parts) => {
                let id = store.mpu_create("b", key, meta(v)).await?;
                let mut list = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    let n = i as u32 + 1;
                    let mut w = store.put_part_stream("b", key, &id, n)?;
                    w.write(p.clone()).await?;
                    let etag = md5_hex(p);
                    w.set_etag(etag.clone());
                    w.finish().await?;
                    list.push((n, etag));
                }
                store.mpu_complete("b", key, &id, &list).await.map(|_| ())
            }
        }
    }
}

/// Reads every key back after a recovery and checks it against the model;
/// what is seen becomes the acknowledged state.
async fn check_recovered(store: &Store, model: &mut [KeyModel], totals: &mut Totals, seed: u64) {
    for (k, m) in model.iter_mut().enumerate() {
        let name = key_name(k);
        let got: Version = match read_all(store, "b", &name).await {
            Ok(bytes) => {
                let r = store.open_read("b", &name).await.expect("open after read");
                let tag = r.meta.content_type.clone();
                let v: u64 = tag
                    .strip_prefix('v')
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("seed {seed} {name}: content type {tag:?}"));
                Some((v, Bytes::from(bytes)))
            }
            Err(StoreError::NotFound) => None,
            Err(e) => panic!(
                "seed {seed} {name}: read after recovery failed: {e}; history: {}",
                m.history.join(", ")
            ),
        };
        let ok = got == m.acked || m.in_flight.as_ref() == Some(&got);
        assert!(
            ok,
            "seed {seed} {name}: after power loss shows {}, acknowledged {}, in flight {}; history: {}",
            describe(&got),
            describe(&m.acked),
            m.in_flight.as_ref().map_or("none".into(), describe),
            m.history.join(", ")
        );
        if m.in_flight.is_some() {
            totals.in_flight += 1;
            if got != m.acked {
                totals.in_flight_visible += 1;
            }
        }
        m.history.push(format!("recovered {}", describe(&got)));
        m.acked = got;
        m.in_flight = None;
    }
    let listed = list_names(store, "b");
    let present: Vec<String> = (0..model.len())
        .filter(|&k| model[k].acked.is_some())
        .map(key_name)
        .collect();
    assert_eq!(listed, present, "seed {seed}: listing after recovery");
}

/// One life: recover `dir` (power may go out during recovery), check the
/// model, run the workload until power goes out. Returns the directory the
/// cut left, and the model.
fn life(
    seed: u64,
    life_no: u64,
    dir: PathBuf,
    next: PathBuf,
    mut model: Vec<KeyModel>,
    version_base: u64,
    last: bool,
) -> (Vec<KeyModel>, Totals) {
    let (tx, rx) = std::sync::mpsc::channel();
    run(move || async move {
        let mut totals = Totals::default();
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1000) + life_no);
        let sim = SimDisk::adopt(&dir, rng.gen()).unwrap();
        // A power cut during recovery, one life in four.
        let recovery_cut = life_no > 0 && !last && rng.gen_range(0..4) == 0;
        if recovery_cut {
            sim.cut_at_event(rng.gen_range(1..12));
        }
        let opened = Store::open(config(&dir, &sim)).await;
        let store = match opened {
            Ok((store, _)) if !sim.is_cut() => store,
            Ok((store, _)) => {
                store.shutdown().await;
                drop(store);
                totals.recovery_cuts += 1;
                finish(&sim, &next, &mut totals);
                tx.send((model, totals)).unwrap();
                return;
            }
            Err(e) => {
                assert!(
                    sim.is_cut(),
                    "seed {seed}: recovery failed without a cut: {e}"
                );
                totals.recovery_cuts += 1;
                finish(&sim, &next, &mut totals);
                tx.send((model, totals)).unwrap();
                return;
            }
        };
        if recovery_cut {
            // The cut was scheduled past what recovery did.
            sim.cut_at_event(u64::MAX / 2);
        }
        if life_no > 0 {
            check_recovered(&store, &mut model, &mut totals, seed).await;
        }
        if last {
            store.shutdown().await;
            tx.send((model, totals)).unwrap();
            return;
        }
        store.bucket_create("b").await.expect("bucket");
        let every = rng.gen_range(1..=4u64);
        // Some lives mostly delete: tombstones, and compactions that drop
        // them once nothing they hide is left on disk.
        let delete_pct = [20, 20, 70][rng.gen_range(0..3)];
        if rng.gen_range(0..3) == 0 {
            // Aim at the window after a compaction deleted a segment,
            // before the directory change is (or is not) made durable.
            sim.cut_at_event(rng.gen_range(600..1500));
            sim.cut_after_unlinks(rng.gen_range(1..6), rng.gen_range(1..80));
        } else {
            // Power goes out somewhere in the next few hundred events.
            sim.cut_at_event(rng.gen_range(1..600));
        }
        let model_cell = Rc::new(std::cell::RefCell::new(model));
        let version = Rc::new(Cell::new(version_base));
        let acked = Rc::new(Cell::new(0u64));
        let mpu_done = Rc::new(Cell::new(0u64));
        // Compaction runs beside the workers, once every few operations
        // (driven by their progress, not by a clock, so that a seed replays).
        let (done_tx, done_rx) = glommio::channels::local_channel::new_unbounded::<()>();
        let done_tx = Rc::new(done_tx);
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let done = done_tx.clone();
                let (store, sim, model, version, acked, mpu_done) = (
                    store.clone(),
                    sim.clone(),
                    model_cell.clone(),
                    version.clone(),
                    acked.clone(),
                    mpu_done.clone(),
                );
                let mut rng = StdRng::seed_from_u64(rng.gen());
                async move {
                    for _ in 0..2000 {
                        if sim.is_cut() {
                            break;
                        }
                        let k = w * KEYS_PER_WORKER + rng.gen_range(0..KEYS_PER_WORKER);
                        let v = version.get() + 1;
                        version.set(v);
                        let name = key_name(k);
                        let plan = Plan::draw(&mut rng, v, delete_pct);
                        let target = plan.target(v);
                        model.borrow_mut()[k].in_flight = Some(target.clone());
                        let r = plan.run(&store, &name, v).await;
                        let _ = done.try_send(());
                        let multipart = matches!(plan, Plan::Multipart(_));
                        let mut m = model.borrow_mut();
                        let km = &mut m[k];
                        match r {
                            // Every success is an acknowledgement, even
                            // one this task sees only after the cut: the
                            // store must never answer success for what is
                            // not durable, power or no power.
                            Ok(()) => {
                                let when = if sim.is_cut() {
                                    " (seen after the cut)"
                                } else {
                                    ""
                                };
                                km.history
                                    .push(format!("acked {}{when}", describe(&target)));
                                km.acked = target;
                                km.in_flight = None;
                                acked.set(acked.get() + 1);
                                if multipart {
                                    mpu_done.set(mpu_done.get() + 1);
                                }
                            }
                            Err(e) => {
                                assert!(
                                    sim.is_cut(),
                                    "seed {seed} {name}: failed with power on: {e}"
                                );
                                km.history
                                    .push(format!("failed at the cut {}", describe(&target)));
                                break;
                            }
                        }
                    }
                }
            })
            .collect();
        let compactor = {
            let (store, sim) = (store.clone(), sim.clone());
            async move {
                let (mut n, mut ops) = (0u64, 0u64);
                while done_rx.recv().await.is_some() {
                    ops += 1;
                    if sim.is_cut() || ops % every != 0 {
                        continue;
                    }
                    match store.compact_once().await {
                        Ok(Some(_)) => n += 1,
                        Ok(None) => {}
                        Err(e) => assert!(
                            sim.is_cut() || matches!(e, StoreError::Invalid(_)),
                            "seed {seed}: compaction failed with power on: {e}"
                        ),
                    }
                }
                n
            }
        };
        drop(done_tx);
        let (_, compactions) =
            futures::future::join(futures::future::join_all(workers), compactor).await;
        totals.compactions += compactions;
        totals.acked += acked.get();
        totals.mpu_completed += mpu_done.get();
        assert!(
            sim.is_cut(),
            "seed {seed}: the workload ended before the power cut"
        );
        // Stop its tasks (every write fails now), so that its files close on
        // this executor: thousands of lives must not run out of descriptors.
        store.shutdown().await;
        drop(store);
        for _ in 0..3 {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        finish(&sim, &next, &mut totals);
        let model = Rc::try_unwrap(model_cell)
            .ok()
            .expect("workers done")
            .into_inner();
        tx.send((model, totals)).unwrap();
    });
    let (model, mut totals) = rx.recv().unwrap();
    totals.lives += 1;
    (model, totals)
}

fn finish(sim: &SimDisk, next: &Path, totals: &mut Totals) {
    let image = sim.image();
    image.write_to(next).unwrap();
    if std::env::var("PERCORE_POWER_LOSS_KEEP").is_ok_and(|v| v == "1") {
        image.write_to(&next.with_extension("image")).unwrap();
    }
    let s: SimStats = sim.stats();
    totals.sectors_dropped += image.sectors_dropped;
    totals.sectors_kept += image.sectors_kept;
    totals.dir_changes_dropped += image.dir_changes_dropped;
    totals.dir_changes_kept += image.dir_changes_kept;
    totals.file_syncs += s.file_syncs;
    totals.dir_syncs += s.dir_syncs;
    totals.unlinks += s.unlinks;
}

fn scratch() -> tempfile::TempDir {
    // tmpfs when there is one: the model, not the device, decides what
    // survives, and fsyncs there cost nothing.
    // Only with room to spare (a container's /dev/shm may be 64 MiB; a
    // seed's lives take tens of MiB, more with PERCORE_POWER_LOSS_KEEP).
    let shm = Path::new("/dev/shm");
    if free_bytes(shm).is_some_and(|b| b >= 1 << 30) {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

#[test]
fn acknowledged_operations_survive_power_loss() {
    let seeds = env_u64("PERCORE_POWER_LOSS_SEEDS", 256);
    let base = env_u64("PERCORE_POWER_LOSS_SEED_BASE", 0);
    let lives = env_u64("PERCORE_POWER_LOSS_LIVES", 4);
    // Keep every life's directory (to look at a failure with `percore fsck`).
    let keep = env_u64("PERCORE_POWER_LOSS_KEEP", 0) == 1;
    let mut t = Totals::default();
    for seed in base..base + seeds {
        let scratch = scratch();
        let root = scratch.path().to_path_buf();
        let _cleanup = if keep {
            println!("seed {seed}: {}", scratch.keep().display());
            None
        } else {
            Some(scratch)
        };
        let mut model = vec![KeyModel::default(); KEYS];
        let mut dir = root.join("life-0");
        std::fs::create_dir_all(&dir).unwrap();
        for life_no in 0..=lives {
            let next = root.join(format!("life-{}", life_no + 1));
            let last = life_no == lives;
            let (m, lt) = life(
                seed,
                life_no,
                dir.clone(),
                next.clone(),
                model,
                (life_no + 1) << 32,
                last,
            );
            model = m;
            t.add(&lt);
            if !keep {
                let _ = std::fs::remove_dir_all(&dir);
            }
            dir = next;
        }
    }
    println!(
        "power loss: {seeds} seeds, {} lives ({} cut during recovery); {} acknowledged \
         operations ({} multipart), {} in flight at a cut ({} visible after it); {} compactions, \
         {} unlinks, {} file and {} directory syncs; unsynced sectors kept/dropped {}/{}, \
         unsynced directory changes kept/dropped {}/{}",
        t.lives,
        t.recovery_cuts,
        t.acked,
        t.mpu_completed,
        t.in_flight,
        t.in_flight_visible,
        t.compactions,
        t.unlinks,
        t.file_syncs,
        t.dir_syncs,
        t.sectors_kept,
        t.sectors_dropped,
        t.dir_changes_kept,
        t.dir_changes_dropped,
    );
    // The property only means something if every phase was reached.
    assert!(
        t.acked > 0 && t.in_flight > 0 && t.in_flight_visible > 0,
        "no operations at the cuts"
    );
    assert!(t.compactions > 0 && t.unlinks > 0, "compaction never ran");
    assert!(t.mpu_completed > 0, "no multipart upload completed");
    assert!(t.recovery_cuts > 0, "power never went out during recovery");
    assert!(
        t.sectors_dropped > 0 && t.dir_changes_dropped > 0,
        "the cuts dropped nothing"
    );
}
