//! Fault-injection model test: the store on real files under a seeded storm
//! of injected faults (ENOSPC and EIO on segment creation, writes and
//! fsyncs; EIO on reads; torn writes that leave a zeroed or garbage tail in
//! the file and then fail; short writes that stop early and leave nothing
//! beyond), checked against a model of acknowledged operations.
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

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;

use bytes::Bytes;
use percore_server::store::file::{FaultPoint, TornWrite};
use percore_server::store::record::ObjectMeta;
use percore_server::store::{Store, StoreConfig, StoreError};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::{read_all, run, small_config};

const KEYS: usize = 24;

fn payload(key: usize, version: u64, len: usize) -> Bytes {
    let mut rng = StdRng::seed_from_u64(version.wrapping_mul(31) ^ key as u64);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    Bytes::from(v)
}

fn key_name(k: usize) -> String {
    format!("k/{k:02}")
}

/// The fault schedule: off, or on with a probability per I/O point.
struct Faults {
    rng: RefCell<StdRng>,
    percent: Cell<u32>,
    injected: Cell<u64>,
    torn: Cell<u64>,
    short: Cell<u64>,
}

impl Faults {
    fn decide(&self, p: FaultPoint) -> Option<io::Error> {
        let percent = self.percent.get();
        let mut rng = self.rng.borrow_mut();
        if percent == 0 || rng.gen_range(0..100) >= percent {
            return None;
        }
        self.injected.set(self.injected.get() + 1);
        let os = |code| Some(io::Error::from_raw_os_error(code));
        match p {
            FaultPoint::Create { .. } => os(if rng.gen_bool(0.5) {
                libc::ENOSPC
            } else {
                libc::EIO
            }),
            FaultPoint::Write { len_bytes, .. } => match rng.gen_range(0..5) {
                0 => os(libc::ENOSPC),
                1 => os(libc::EIO),
                n => {
                    let short = n == 4;
                    let counter = if short { &self.short } else { &self.torn };
                    counter.set(counter.get() + 1);
                    Some(io::Error::other(TornWrite {
                        bytes: rng.gen_range(0..len_bytes.max(1)),
                        garbage: rng.gen_bool(0.5),
                        short,
                    }))
                }
            },
            FaultPoint::Sync { .. } => os(libc::EIO),
            FaultPoint::Read { .. } => os(libc::EIO),
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
    let listed: Vec<String> = store
        .list("b", "", "", None, usize::MAX)
        .into_iter()
        .map(|i| i.name().to_string())
        .collect();
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

#[test]
fn faults_never_lose_acknowledged_writes_nor_serve_wrong_bytes() {
    let seeds: u64 = std::env::var("PERCORE_FAULT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let mut totals = [0u64; 8];
    for seed in 0..seeds {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        run(move || async move {
            let faults = Rc::new(Faults {
                rng: RefCell::new(StdRng::seed_from_u64(seed ^ 0xFA17)),
                percent: Cell::new(0),
                injected: Cell::new(0),
                torn: Cell::new(0),
                short: Cell::new(0),
            });
            let mut rng = StdRng::seed_from_u64(seed);
            let (mut store, _) = Store::open(config(&path, &faults)).await.unwrap();
            let mut model = vec![KeyModel::default(); KEYS];
            let (mut failed, mut acked, mut reads, mut read_errors, mut resurrected) =
                (0u64, 0u64, 0u64, 0u64, 0u64);
            let mut version = 0u64;
            for round in 0..8 {
                faults.percent.set([0, 3, 8, 20][round % 4]);
                for _ in 0..40 {
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
                let (r, _) = check_live(&store, &model, &faults).await;
                reads += r;
                // Restart every other round, with compaction in between.
                if round % 2 == 1 {
                    let compacted = store.compact_once().await;
                    for m in model.iter_mut() {
                        m.history.push(format!(
                            "compaction {:?}",
                            compacted.as_ref().map(|r| r.is_some())
                        ));
                    }
                    store.shutdown().await;
                    drop(store);
                    store = Store::open(config(&path, &faults)).await.unwrap().0;
                    resurrected += settle_after_restart(&store, &mut model).await;
                    check_live(&store, &model, &faults).await;
                }
            }
            store.shutdown().await;
            tx.send([
                acked,
                failed,
                faults.injected.get(),
                faults.torn.get(),
                faults.short.get(),
                reads,
                read_errors,
                resurrected,
            ])
            .unwrap();
        });
        let t = rx.recv().unwrap();
        for (a, b) in totals.iter_mut().zip(t) {
            *a += b;
        }
    }
    let [acked, failed, injected, torn, short, reads, read_errors, resurrected] = totals;
    println!(
        "faults: {seeds} seeds, {acked} acknowledged and {failed} failed writes, \
         {injected} faults injected ({torn} torn and {short} short writes), {reads} checked reads \
         ({read_errors} failed by injected read faults), {resurrected} failed writes \
         visible after restart"
    );
    assert!(
        failed > 0 && torn > 0 && short > 0 && acked > failed,
        "the storm did not bite"
    );
}
