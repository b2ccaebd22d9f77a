//! Fault-injection model test: the store on real files under a seeded storm
//! of injected faults (ENOSPC and EIO on segment creation, writes, seals and
//! fsyncs; EIO on reads; torn writes that leave a zeroed or garbage tail in
//! the file and then fail; short writes that stop early and leave nothing
//! beyond), checked against a model of acknowledged operations. Faults fire
//! in every phase: foreground writes and reads, segment creation, sealing,
//! compaction, and recovery; restarts alternate between a clean stop and a
//! crash-style one (no seal, nothing flushed by a shutdown).
//!
//! What must hold, live and across restarts:
//! * an acknowledged PUT or DELETE is what reads see, until the next
//!   acknowledged operation on that key; no fault may lose it;
//! * a failed operation changes nothing live; after a restart it may show
//!   (it may have reached the disk before the failure), nothing else may;
//! * a read returns exactly the acknowledged bytes, or an error, and an
//!   error only when a fault was injected into that read;
//! * listing shows exactly the present keys;
//! * after every fault the store keeps serving: with faults off, every
//!   operation succeeds.

// A test is one scenario read top to bottom; splitting it would hide the story.
#![allow(clippy::too_many_lines)]

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;

use bytes::Bytes;
use percore_server::store::file::{FaultPoint, TornWrite};
use percore_server::store::record::ObjectMeta;
use percore_server::store::{Store, StoreConfig, StoreError};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::{list_names, read_all, run, small_config};

const KEYS: usize = 24;

fn payload(key: usize, version: u64, len: usize) -> Bytes {
    common::seeded_bytes(version.wrapping_mul(31) ^ key as u64, len)
}

fn key_name(k: usize) -> String {
    format!("k/{k:02}")
}

/// What the store is doing when a fault fires (set by the test around each
/// call), so that the test can require faults in every phase.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Foreground = 0,
    Compaction = 1,
    Recovery = 2,
}

/// Kinds of injected faults, for the "each kind fired" requirement.
const KINDS: [&str; 7] = ["create", "write", "torn", "short", "sync", "seal", "read"];

/// The fault schedule: off, or on with a probability per I/O point.
struct Faults {
    rng: RefCell<StdRng>,
    percent: Cell<u32>,
    injected: Cell<u64>,
    phase: Cell<Phase>,
    /// Faults fired, per phase and kind.
    fired: RefCell<[[u64; KINDS.len()]; 3]>,
}

impl Faults {
    fn new(seed: u64) -> Faults {
        Faults {
            rng: RefCell::new(StdRng::seed_from_u64(seed ^ 0xFA17)),
            percent: Cell::new(0),
            injected: Cell::new(0),
            phase: Cell::new(Phase::Foreground),
            fired: RefCell::new([[0; KINDS.len()]; 3]),
        }
    }

    fn count(&self, kind: &str) {
        let k = KINDS.iter().position(|x| *x == kind).expect("kind");
        self.fired.borrow_mut()[self.phase.get() as usize][k] += 1;
        self.injected.set(self.injected.get() + 1);
    }

    fn decide(&self, p: FaultPoint) -> Option<io::Error> {
        let percent = self.percent.get();
        let mut rng = self.rng.borrow_mut();
        if percent == 0 || rng.gen_range(0..100) >= percent {
            return None;
        }
        let os = |code| Some(io::Error::from_raw_os_error(code));
        let full_or_eio = |rng: &mut StdRng| {
            os(if rng.gen_bool(0.5) {
                libc::ENOSPC
            } else {
                libc::EIO
            })
        };
        match p {
            FaultPoint::Create { .. } => {
                self.count("create");
                full_or_eio(&mut rng)
            }
            // A zero-length write point is the cut of a failed batch:
            // nothing to tear there.
            FaultPoint::Write { len_bytes, .. } => match rng.gen_range(0..5) {
                n if n <= 1 || len_bytes == 0 => {
                    self.count("write");
                    full_or_eio(&mut rng)
                }
                n => {
                    let short = n == 4;
                    self.count(if short { "short" } else { "torn" });
                    Some(io::Error::other(TornWrite {
                        bytes: rng.gen_range(0..len_bytes.max(1)),
                        garbage: rng.gen_bool(0.5),
                        short,
                    }))
                }
            },
            FaultPoint::Seal { .. } => {
                self.count("seal");
                full_or_eio(&mut rng)
            }
            FaultPoint::Sync { .. } => {
                self.count("sync");
                os(libc::EIO)
            }
            FaultPoint::Read { .. } => {
                self.count("read");
                os(libc::EIO)
            }
        }
    }
}

/// Per key: the acknowledged state and the states that failed operations
/// since then may have left on disk.
#[derive(Default, Clone)]
struct KeyModel {
    acked: Option<Bytes>,
    maybe: Vec<Option<Bytes>>,
    /// What happened to the key, for the failure message.
    history: Vec<String>,
}

fn describe(state: &Option<Bytes>) -> String {
    state
        .as_ref()
        .map_or("absent".into(), |b| format!("{} bytes", b.len()))
}

fn config(path: &std::path::Path, faults: &Rc<Faults>) -> StoreConfig {
    let mut cfg = small_config(path);
    let f = faults.clone();
    cfg.faults = Some(Rc::new(RefCell::new(move |p: FaultPoint| f.decide(p))));
    cfg
}

async fn check_live(store: &Store, model: &[KeyModel], faults: &Faults) -> (u64, u64) {
    let (mut reads, mut read_errors) = (0, 0);
    for (k, m) in model.iter().enumerate() {
        let before = faults.injected.get();
        let got = read_all(store, "b", &key_name(k)).await;
        reads += 1;
        match (got, &m.acked) {
            (Ok(bytes), Some(want)) => assert!(bytes == want[..], "{}: wrong bytes", key_name(k)),
            (Err(StoreError::NotFound), None) => {}
            (Err(e), _) if faults.injected.get() > before => {
                assert!(
                    !matches!(e, StoreError::NotFound),
                    "{}: a read fault made an acknowledged key vanish",
                    key_name(k)
                );
                read_errors += 1;
            }
            (got, want) => panic!(
                "{}: got {:?}, acknowledged {}",
                key_name(k),
                got.map(|b| b.len()),
                want.as_ref()
                    .map_or("absent".into(), |b| format!("{} bytes", b.len()))
            ),
        }
    }
    let listed = list_names(store, "b");
    let present: Vec<String> = (0..model.len())
        .filter(|&k| model[k].acked.is_some())
        .map(key_name)
        .collect();
    assert_eq!(listed, present);
    (reads, read_errors)
}

/// After a restart: each key shows its acknowledged state or one a failed
/// operation may have left; that becomes the new acknowledged state.
async fn settle_after_restart(store: &Store, model: &mut [KeyModel]) -> u64 {
    let mut resurrected = 0;
    for (k, m) in model.iter_mut().enumerate() {
        let got = match read_all(store, "b", &key_name(k)).await {
            Ok(b) => Some(Bytes::from(b)),
            Err(StoreError::NotFound) => None,
            Err(e) => panic!("{}: read after restart failed: {e}", key_name(k)),
        };
        if got != m.acked {
            assert!(
                m.maybe.contains(&got),
                "{}: after restart shows {}, acknowledged {}; history: {}",
                key_name(k),
                describe(&got),
                describe(&m.acked),
                m.history.join(", ")
            );
            resurrected += 1;
        }
        m.history.push(format!("restart: {}", describe(&got)));
        m.acked = got;
        m.maybe.clear();
    }
    resurrected
}

/// Compaction with faults on: it either completes (the victim, and only
/// it, leaves the segment table) or fails because a fault fired in it and
/// removes nothing. With faults off it never fails.
async fn compact_checked(store: &Store, faults: &Faults, model: &mut [KeyModel]) -> bool {
    let before: Vec<u64> = store.segment_table().iter().map(|s| s.0).collect();
    let injected = faults.injected.get();
    faults.phase.set(Phase::Compaction);
    let result = store.compact_once().await;
    faults.phase.set(Phase::Foreground);
    let after: Vec<u64> = store.segment_table().iter().map(|s| s.0).collect();
    let removed: Vec<u64> = before
        .iter()
        .copied()
        .filter(|id| !after.contains(id))
        .collect();
    let outcome = match &result {
        Ok(Some(r)) => {
            assert_eq!(removed, vec![r.segment_id], "compaction reported {r:?}");
            "done"
        }
        Ok(None) => {
            assert!(
                removed.is_empty(),
                "no compaction, yet segments {removed:?} went"
            );
            "nothing to do"
        }
        Err(e) => {
            assert!(
                faults.injected.get() > injected,
                "compaction failed without an injected fault: {e}"
            );
            assert!(
                removed.is_empty(),
                "a failed compaction removed {removed:?}"
            );
            "failed"
        }
    };
    for m in model.iter_mut() {
        m.history.push(format!("compaction {outcome}"));
    }
    matches!(result, Ok(Some(_)))
}

/// Stops the store cleanly (seal, flush) or as a crash would (dropped:
/// the active segment stays unsealed), then recovers it with faults on (at
/// `percent`); a recovery that fails must have had a fault, and is retried
/// with faults off. A recovery under faults is then dropped crash-style and
/// recovered again with faults off, so the model is checked against what a
/// faulty recovery left on disk: it must never cost an acknowledged write.
async fn restart(
    store: Store,
    clean: bool,
    percent: u32,
    cfg: impl Fn() -> StoreConfig,
    faults: &Faults,
) -> Store {
    if clean {
        store.shutdown().await;
    }
    drop(store);
    faults.phase.set(Phase::Recovery);
    faults.percent.set(percent);
    let injected = faults.injected.get();
    match Store::open(cfg()).await {
        Ok((faulty, _)) => drop(faulty),
        Err(e) => assert!(
            faults.injected.get() > injected,
            "recovery failed without an injected fault: {e}"
        ),
    }
    faults.percent.set(0);
    let injected = faults.injected.get();
    let (store, _) = Store::open(cfg())
        .await
        .expect("recovery with faults off succeeds");
    assert_eq!(faults.injected.get(), injected);
    faults.phase.set(Phase::Foreground);
    store
}

#[test]
fn faults_never_lose_acknowledged_writes_nor_serve_wrong_bytes() {
    let seeds: u64 = std::env::var("PERCORE_FAULT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let mut totals = [0u64; 8];
    let mut fired = [[0u64; KINDS.len()]; 3];
    for seed in 0..seeds {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        run(move || async move {
            let faults = Rc::new(Faults::new(seed));
            let cfg = || config(&path, &faults);
            let mut rng = StdRng::seed_from_u64(seed);
            let (mut store, _) = Store::open(cfg()).await.unwrap();
            let mut model = vec![KeyModel::default(); KEYS];
            let (mut failed, mut acked, mut reads, mut read_errors, mut resurrected) =
                (0u64, 0u64, 0u64, 0u64, 0u64);
            let mut compactions = 0u64;
            let mut version = 0u64;
            for round in 0..8 {
                let percent = [0, 3, 8, 20][round % 4];
                faults.percent.set(percent);
                for step in 0..40 {
                    // 1-4 operations on distinct keys at once: they share
                    // group commits, so one fault fails several.
                    let mut keys: Vec<usize> = (0..KEYS).collect();
                    let n = rng.gen_range(1..=4);
                    let ops: Vec<(usize, Option<Bytes>)> = (0..n)
                        .map(|_| {
                            let k = keys.swap_remove(rng.gen_range(0..keys.len()));
                            version += 1;
                            let data = rng.gen_bool(0.75).then(|| {
                                let len = match rng.gen_range(0..8) {
                                    0 => 0,
                                    1..=5 => rng.gen_range(1..6000),
                                    _ => rng.gen_range(16 * 1024..90 * 1024),
                                };
                                payload(k, version, len)
                            });
                            (k, data)
                        })
                        .collect();
                    let results = futures::future::join_all(ops.iter().map(|(k, data)| {
                        let store = store.clone();
                        async move {
                            match data {
                                Some(d) => store
                                    .put("b", &key_name(*k), ObjectMeta::default(), d.clone())
                                    .await
                                    .map(|_| ()),
                                None => store.delete("b", &key_name(*k)).await.map(|_| ()),
                            }
                        }
                    }))
                    .await;
                    for ((k, data), r) in ops.into_iter().zip(results) {
                        match r {
                            Ok(()) => {
                                model[k].history.push(format!("acked {}", describe(&data)));
                                model[k].acked = data;
                                model[k].maybe.clear();
                                acked += 1;
                            }
                            Err(e) => {
                                assert!(
                                    matches!(e, StoreError::Io(_) | StoreError::NoSpace(_)),
                                    "unexpected error {e}"
                                );
                                assert!(faults.percent.get() > 0, "failed with faults off: {e}");
                                model[k]
                                    .history
                                    .push(format!("failed {} ({e})", describe(&data)));
                                model[k].maybe.push(data);
                                failed += 1;
                            }
                        }
                    }
                    // Compaction under the same faults, now and then.
                    if step % 10 == 9 && compact_checked(&store, &faults, &mut model).await {
                        compactions += 1;
                    }
                }
                let (r, re) = check_live(&store, &model, &faults).await;
                reads += r;
                read_errors += re;
                // Faults off: the store must serve everything again.
                faults.percent.set(0);
                let probe = payload(KEYS, round as u64, 3000);
                store
                    .put("b", "probe", ObjectMeta::default(), probe.clone())
                    .await
                    .expect("a PUT after the faults stop succeeds");
                assert!(read_all(&store, "b", "probe").await.unwrap() == probe[..]);
                store.delete("b", "probe").await.unwrap();
                if compact_checked(&store, &faults, &mut model).await {
                    compactions += 1;
                }
                let (r, _) = check_live(&store, &model, &faults).await;
                reads += r;
                // Restart every other round: clean and crash-style stops
                // in turn, recovery under this round's faults.
                if round % 2 == 1 {
                    let clean = round % 4 == 1;
                    for m in model.iter_mut() {
                        m.history.push(format!(
                            "restart ({})",
                            if clean { "clean" } else { "crash" }
                        ));
                    }
                    store = restart(store, clean, percent.max(8), cfg, &faults).await;
                    resurrected += settle_after_restart(&store, &mut model).await;
                    check_live(&store, &model, &faults).await;
                }
            }
            store.shutdown().await;
            tx.send((
                [
                    acked,
                    failed,
                    faults.injected.get(),
                    compactions,
                    reads,
                    read_errors,
                    resurrected,
                    0,
                ],
                *faults.fired.borrow(),
            ))
            .unwrap();
        });
        let (t, f) = rx.recv().unwrap();
        for (a, b) in totals.iter_mut().zip(t) {
            *a += b;
        }
        for (fa, fb) in fired.iter_mut().zip(f) {
            for (a, b) in fa.iter_mut().zip(fb) {
                *a += b;
            }
        }
    }
    let [acked, failed, injected, compactions, reads, read_errors, resurrected, _] = totals;
    println!(
        "faults: {seeds} seeds, {acked} acknowledged and {failed} failed writes, \
         {injected} faults injected, {compactions} compactions, {reads} checked reads \
         ({read_errors} failed by injected read faults), {resurrected} failed writes \
         visible after restart"
    );
    for (phase, counts) in ["foreground", "compaction", "recovery"].iter().zip(&fired) {
        let list: Vec<String> = KINDS
            .iter()
            .zip(counts)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!("  faults fired in {phase}: {}", list.join(", "));
    }
    assert!(acked > failed && failed > 0, "the storm did not bite");
    assert!(compactions > 0, "no compaction completed");
    // Every kind of fault fired, and faults fired in every phase.
    for (k, kind) in KINDS.iter().enumerate() {
        let n: u64 = fired.iter().map(|p| p[k]).sum();
        assert!(n > 0, "no {kind} fault fired");
    }
    let sum = |p: Phase| fired[p as usize].iter().sum::<u64>();
    assert!(
        sum(Phase::Compaction) > 0,
        "no fault fired during compaction"
    );
    assert!(sum(Phase::Recovery) > 0, "no fault fired during recovery");
    let seals = KINDS.iter().position(|k| *k == "seal").unwrap();
    let creates = KINDS.iter().position(|k| *k == "create").unwrap();
    assert!(
        fired.iter().map(|p| p[seals]).sum::<u64>() > 0,
        "no fault fired while sealing"
    );
    assert!(
        fired.iter().map(|p| p[creates]).sum::<u64>() > 0,
        "no fault fired while creating a segment"
    );
    let compaction_io = ["write", "torn", "short", "sync", "read"]
        .iter()
        .map(|k| fired[Phase::Compaction as usize][KINDS.iter().position(|x| x == k).unwrap()])
        .sum::<u64>();
    assert!(
        compaction_io > 0,
        "compaction's own reads and writes never failed"
    );
}
