//! The map's transactions against a real etcd, started by each test with
//! etcd's default limits (`--max-txn-ops 128`): changes that touch more
//! nodes than one transaction may (a cluster of hundreds started at once,
//! a node holding many nodes' groups drained), and a cluster whose records
//! carry their own `filled` flags (made before the `filled` key).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use percore_protocol::placement::{self, NodeState};

use super::*;

/// An etcd of one member on loopback, stopped when dropped.
pub(crate) struct EtcdProcess {
    child: Child,
    pub(crate) urls: String,
    _dir: tempfile::TempDir,
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// None (the test is skipped, and says so) when etcd is not installed,
/// unless `PERCORE_CI_NO_SKIPS=1` (tests/run.sh sets it, and installs
/// etcd first): then the test fails.
pub(crate) fn start_etcd() -> Option<EtcdProcess> {
    let installed = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        assert!(
            std::env::var("PERCORE_CI_NO_SKIPS").as_deref() != Ok("1"),
            "etcd is not installed: tools/install-test-deps.sh installs etcd-server"
        );
        eprintln!(
            "skipped: etcd is not installed (tools/install-test-deps.sh installs etcd-server)"
        );
        return None;
    }
    // On tmpfs where there is one: etcd's fsyncs cost nothing there (a
    // slow disk stalls it past a short lease's renewals).
    let dir = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm"),
        false => tempfile::tempdir(),
    }
    .expect("a temporary directory");
    let (client, peer) = (free_port(), free_port());
    let urls = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd's log file");
    let child = Command::new("etcd")
        .args(["--name", "m0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--listen-client-urls",
            &urls,
            "--advertise-client-urls",
            &urls,
        ])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("m0={peer_url}")])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("etcd is not installed: tools/install-test-deps.sh installs etcd-server");
    let etcd = EtcdProcess {
        child,
        urls,
        _dir: dir,
    };
    let client = Etcd::new(&etcd.urls).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while client.get(b"/ready").is_err() {
        assert!(Instant::now() < until, "etcd did not start within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(etcd)
}

/// A cluster `name` made with `replicas` and `pgs` (600 s down-out) in a
/// new etcd, and a client of it; None where etcd is missing (skipped).
fn new_cluster(
    name: &str,
    replicas: usize,
    pgs: u32,
    seed: u64,
) -> Option<(EtcdProcess, Etcd, Keys)> {
    let e = start_etcd()?;
    let etcd = Etcd::new(&e.urls).unwrap();
    let keys = Keys::new(name).unwrap();
    init(&etcd, &keys, (replicas, pgs, 600), seed).unwrap();
    Some((e, etcd, keys))
}

fn joining(name: &str, zone: &str) -> Joining {
    Joining {
        name: name.into(),
        zone: zone.into(),
        s3: "127.0.0.1:1".into(),
        native: "127.0.0.1:2".into(),
        admin: "127.0.0.1:3".into(),
        shards: 1,
        nonce: name.as_bytes().to_vec(),
        ttl_s: 600,
        fresh: false,
        disk: format!("d-{name}"),
    }
}

/// Nodes n0-n2 in zones z0-z2 joined, synced and filled.
fn three_filled(etcd: &Etcd, keys: &Keys) {
    let nodes: Vec<(String, String)> = (0..3).map(|i| (format!("n{i}"), format!("z{i}"))).collect();
    let ids = join_all(etcd, keys, &nodes);
    sync_all(etcd, keys, &ids);
    let view = load(etcd, keys).unwrap();
    settle(etcd, keys, &view).unwrap();
}

/// Node `name`'s record as etcd holds it now.
fn record_of(etcd: &Etcd, keys: &Keys, name: &str) -> NodeRecord {
    load(etcd, keys)
        .unwrap()
        .node_named(name)
        .map(|(r, _)| r.clone())
        .unwrap()
}

/// Node `name` joins again (a new process, on a new lease) on data
/// directory `disk`, `fresh` or not.
fn rejoin_on(etcd: &Etcd, keys: &Keys, name: &str, (disk, fresh): (&str, bool)) -> NodeRecord {
    let lease = etcd.lease_grant(600).unwrap();
    let r = record_of(etcd, keys, name);
    let joining = Joining {
        fresh,
        disk: disk.into(),
        ..joining(name, &r.zone)
    };
    join(etcd, keys, &joining, lease, Some(r.id)).unwrap()
}

/// Marks node `id` synced under the map etcd holds now.
fn sync_one(etcd: &Etcd, keys: &Keys, id: u32) {
    let view = load(etcd, keys).unwrap();
    let skipped = view.skipped.get(&id).copied().unwrap_or(0);
    assert!(mark_synced(etcd, keys, id, view.epoch, skipped).unwrap());
}

/// Joins `nodes` (name, zone), each on a lease of its own.
fn join_all(etcd: &Etcd, keys: &Keys, nodes: &[(String, String)]) -> Vec<u32> {
    nodes
        .iter()
        .map(|(name, zone)| {
            let lease = etcd.lease_grant(600).unwrap();
            join(etcd, keys, &joining(name, zone), lease, None)
                .unwrap_or_else(|e| panic!("{name} joins: {e:?}"))
                .id
        })
        .collect()
}

/// Marks every node synced (as each would once caught up), one at a
/// time: none of them may be filled alone.
fn sync_all(etcd: &Etcd, keys: &Keys, ids: &[u32]) {
    for &id in ids {
        let view = load(etcd, keys).unwrap();
        let skipped = view.skipped.get(&id).copied().unwrap_or(0);
        assert!(
            mark_synced(etcd, keys, id, view.epoch, skipped).unwrap(),
            "{id} marked synced"
        );
    }
}

fn filled_count(view: &View) -> usize {
    view.nodes.iter().filter(|(r, _)| r.filled()).count()
}

/// 300 nodes join a new cluster at once and sync: each was refused
/// filling alone (it would become a settled replica of groups it does not
/// hold), and one `settle` fills them all together, in one transaction of
/// three operations (it was one put and one compare per node: etcd
/// refused it, and the cluster never took a write).
#[test]
fn a_cluster_of_hundreds_started_at_once_is_filled_in_one_step() {
    let Some((_e, etcd, keys)) = new_cluster("many", 3, 256, 0x5eed) else {
        return;
    };
    let nodes: Vec<(String, String)> = (0..300)
        .map(|i| (format!("n{i}"), format!("z{}", i % 10)))
        .collect();
    let ids = join_all(&etcd, &keys, &nodes);
    sync_all(&etcd, &keys, &ids);
    let view = load(&etcd, &keys).unwrap();
    assert_eq!(filled_count(&view), 0, "none may be filled alone");
    assert!(view.nodes.iter().all(|(r, _)| r.synced));
    let made = settle(&etcd, &keys, &view).unwrap();
    assert_eq!(made.len(), 300, "every node filled at once");
    assert!(made.iter().all(|(_, filled)| *filled));
    let view = load(&etcd, &keys).unwrap();
    assert_eq!(filled_count(&view), 300);
    assert_eq!(view.filled_ids.as_ref().map(BTreeSet::len), Some(300));
    assert!(
        settle(&etcd, &keys, &view).unwrap().is_empty(),
        "nothing left"
    );
    // Stored once: the records do not carry the flag.
    let (kvs, _) = etcd
        .range(&keys.nodes(), Some(&prefix_end(&keys.nodes())))
        .unwrap();
    assert!(kvs
        .iter()
        .all(|kv| !String::from_utf8_lossy(&kv.value).contains("filled")));
}

/// A node alone in its zone is a replica of every group; drained, its
/// slots go to about 200 other nodes (a third replica each), more than one transaction may mark
/// unsynced: the drain marks them in parts, and every node that gains a
/// group is unsynced once it is recorded (the others are not).
#[test]
fn a_drain_that_gives_hundreds_of_nodes_groups_is_made_in_parts() {
    let Some((_e, etcd, keys)) = new_cluster("wide", 3, 512, 0xd1a1) else {
        return;
    };
    let mut nodes: Vec<(String, String)> = vec![("solo".into(), "a".into())];
    nodes.extend((0..220).map(|i| (format!("n{i}"), format!("z{}", i % 2))));
    let ids = join_all(&etcd, &keys, &nodes);
    sync_all(&etcd, &keys, &ids);
    // (solo was filled with its sync: a replica of every group, it could
    // be alone.)
    let view = load(&etcd, &keys).unwrap();
    assert_eq!(settle(&etcd, &keys, &view).unwrap().len(), nodes.len() - 1);
    let before = load(&etcd, &keys).unwrap();
    assert_eq!(filled_count(&before), nodes.len());
    let seed = before.config.seed().unwrap();
    let placed = before.placed();
    let mut after = placed.clone();
    let solo = after.iter().position(|n| n.id == ids[0]).unwrap();
    after[solo].state = NodeState::Draining;
    let mut gainers = BTreeSet::new();
    for pg in 0..before.config.pgs {
        let was = placement::replicas(seed, pg, 3, &placed);
        assert!(was.contains(&solo), "solo holds group {pg}");
        for i in placement::replicas(seed, pg, 3, &after) {
            if !was.contains(&i) {
                gainers.insert(after[i].id);
            }
        }
    }
    assert!(
        gainers.len() > GAINERS_PER_TXN,
        "{} gainers: more than one transaction's worth",
        gainers.len()
    );
    let drained = update_node(&etcd, &keys, "solo", &|_, r| {
        Ok(Some(NodeRecord {
            state: NodeState::Draining.name().into(),
            ..r.clone()
        }))
    })
    .unwrap();
    assert!(drained.is_some());
    let view = load(&etcd, &keys).unwrap();
    for (r, _) in &view.nodes {
        if r.id == ids[0] {
            assert_eq!(r.node_state(), NodeState::Draining);
        } else {
            assert_eq!(!r.synced, gainers.contains(&r.id), "node {}", r.name);
        }
        assert!(r.filled(), "flags untouched: {}", r.name);
    }
    assert!(view.epoch >= before.epoch + 2, "parts, then the drain");
}

/// A cluster made before the `filled` key: its records carry the flag
/// (false for one node, none for another: filled). The map reads them
/// so, and the first change writes the key with them.
#[test]
fn records_with_their_own_flags_are_read_and_carried_into_the_key() {
    let Some((_e, etcd, keys)) = new_cluster("old", 1, 64, 0x01d) else {
        return;
    };
    let nodes: Vec<(String, String)> = (0..3).map(|i| (format!("n{i}"), "z".into())).collect();
    let ids = join_all(&etcd, &keys, &nodes);
    // As an older version left it: no key, flags in the records.
    assert!(etcd
        .txn(vec![], vec![txn::delete(&keys.filled())], vec![])
        .unwrap());
    let view = load(&etcd, &keys).unwrap();
    for ((record, _), flag) in view.nodes.iter().zip([Some(false), None, Some(true)]) {
        let mut json = serde_json::to_value(NodeRecord {
            filled: flag,
            ..record.clone()
        })
        .unwrap();
        if flag.is_none() {
            json.as_object_mut().unwrap().remove("filled");
        }
        etcd.put(&keys.node(record.id), json.to_string().as_bytes(), 0)
            .unwrap();
    }
    let view = load(&etcd, &keys).unwrap();
    assert!(view.filled_ids.is_none());
    let flags: Vec<bool> = view.nodes.iter().map(|(r, _)| r.filled()).collect();
    assert_eq!(flags, [false, true, true]);
    // A change that writes a record (n1 marked unsynced, as a node that
    // gained groups marks itself): the key now holds the flags.
    update_node(&etcd, &keys, "n1", &|_, r| {
        Ok(Some(NodeRecord {
            synced: false,
            ..r.clone()
        }))
    })
    .unwrap();
    let view = load(&etcd, &keys).unwrap();
    assert_eq!(
        view.filled_ids,
        Some(BTreeSet::from([ids[1], ids[2]])),
        "n0 unfilled, n1 and n2 filled"
    );
    let flags: Vec<bool> = view.nodes.iter().map(|(r, _)| r.filled()).collect();
    assert_eq!(flags, [false, true, true]);
}

/// A filled node that joins again on another data directory (a replaced
/// disk, or one that did not mount) stays filled (it is still where its
/// groups' writes are recorded) but is `empty`, and its record keeps the
/// directory its data is on: that one back, it is not empty. Its sync
/// clears the flag (and records its directory) only where no hand-off
/// is pending (then its settled groups are the ones it caught up). A node
/// that joins unfilled is never empty. A record that names no directory
/// (written before they were kept) takes a fresh one for empty, and
/// keeps the flag until a sync.
#[test]
fn a_filled_node_on_another_disk_is_empty_until_it_syncs() {
    let Some((_e, etcd, keys)) = new_cluster("wiped", 3, 64, 0xd15c) else {
        return;
    };
    three_filled(&etcd, &keys);
    let record = |name: &str| record_of(&etcd, &keys, name);
    let n2 = record("n2");
    assert!(n2.filled() && n2.empty.is_none() && n2.disk.as_deref() == Some("d-n2"));
    let rejoin = |name: &str, disk: &str, fresh: bool| rejoin_on(&etcd, &keys, name, (disk, fresh));
    let sync = |id: u32| sync_one(&etcd, &keys, id);
    // Its disk replaced: filled, empty, unsynced, the old disk recorded;
    // a restart on the new one keeps it so; the old one back is not empty.
    let r = rejoin("n2", "d-n2-new", true);
    assert!(r.filled() && r.empty.is_some() && !r.synced);
    assert_eq!(r.disk.as_deref(), Some("d-n2"));
    let r = rejoin("n2", "d-n2-new", false);
    assert!(r.empty.is_some(), "the new disk restarted");
    let r = rejoin("n2", "d-n2", false);
    assert!(
        r.empty.is_none() && r.disk.as_deref() == Some("d-n2"),
        "the old disk back"
    );
    let r = rejoin("n2", "d-n2-new", false);
    assert!(r.empty.is_some());
    // A node added (joins unfilled, fresh or not: never empty) and not
    // yet filled: a hand-off is pending, so n2's sync keeps the flag.
    let lease = etcd.lease_grant(600).unwrap();
    let added = join(
        &etcd,
        &keys,
        &Joining {
            fresh: true,
            ..joining("n3", "z3")
        },
        lease,
        None,
    )
    .unwrap();
    assert!(!added.filled() && added.empty.is_none());
    sync(r.id);
    let r = record("n2");
    assert!(
        r.synced && r.empty.is_some(),
        "synced with a hand-off pending"
    );
    assert_eq!(r.disk.as_deref(), Some("d-n2"));
    // Once n3 is filled no hand-off is pending: `settle` clears n2's flag
    // (it is synced), and its data is on the new disk from then on.
    sync(added.id);
    let view = load(&etcd, &keys).unwrap();
    settle(&etcd, &keys, &view).unwrap();
    assert!(record("n3").filled());
    let r = record("n2");
    assert!(r.synced && r.empty.is_none() && r.filled());
    assert_eq!(r.disk.as_deref(), Some("d-n2-new"));
    // The old disk is the other one now; with no hand-off pending its sync
    // clears the flag itself.
    let r = rejoin("n2", "d-n2", false);
    assert!(r.empty.is_some());
    sync(r.id);
    let r = record("n2");
    assert!(r.synced && r.empty.is_none() && r.disk.as_deref() == Some("d-n2"));
}

/// A record that names no data directory (written before they were
/// kept): a directory that is not fresh is not known empty (and is
/// recorded); a fresh one is empty, and stays so across joins until a
/// sync, which records it.
#[test]
fn a_record_without_a_disk_takes_a_fresh_directory_for_empty() {
    let Some((_e, etcd, keys)) = new_cluster("legacy", 3, 64, 0x1e9) else {
        return;
    };
    three_filled(&etcd, &keys);
    let record = |name: &str| record_of(&etcd, &keys, name);
    let rejoin = |name: &str, disk: &str, fresh: bool| rejoin_on(&etcd, &keys, name, (disk, fresh));
    let sync = |id: u32| sync_one(&etcd, &keys, id);
    let strip = || {
        let r = record("n1");
        let mut json = serde_json::to_value(&r).unwrap();
        json.as_object_mut().unwrap().remove("disk");
        let view = load(&etcd, &keys).unwrap();
        assert!(etcd
            .txn(
                vec![],
                vec![
                    txn::put(&keys.node(r.id), json.to_string().as_bytes()),
                    txn::put(&keys.epoch(), next_epoch(&view).unwrap().as_bytes()),
                ],
                vec![],
            )
            .unwrap());
        assert_eq!(record("n1").disk, None);
    };
    strip();
    let r = rejoin("n1", "d-n1", false);
    assert!(r.empty.is_none(), "not fresh: not known empty");
    assert_eq!(r.disk.as_deref(), Some("d-n1"), "and recorded");
    strip();
    assert!(rejoin("n1", "d-n1-new", true).empty.is_some());
    let r = rejoin("n1", "d-n1-new", false);
    assert!(r.empty.is_some() && r.disk.is_none(), "kept");
    sync(r.id);
    let r = record("n1");
    assert!(r.empty.is_none() && r.disk.as_deref() == Some("d-n1-new"));
}

#[test]
fn a_bucket_delete_is_made_only_at_its_epoch_and_leaves_a_record() {
    use crate::cluster::catalog::{commit, read, Change, Outcome};
    let Some((_e, etcd, keys)) = new_cluster("deletes", 3, 64, 0xde1) else {
        return;
    };
    three_filled(&etcd, &keys);
    let epoch = load(&etcd, &keys).unwrap().epoch;
    let create = Change::Create {
        name: "bkt".into(),
        owner: None,
    };
    assert_eq!(commit(&etcd, &keys, &create).unwrap().0, Outcome::Done);
    let delete = |epoch| Change::Delete {
        name: "bkt".into(),
        owner: None,
        epoch,
    };
    // The map moved on since the door found the bucket empty: not made.
    assert_eq!(
        commit(&etcd, &keys, &delete(Some(epoch - 1))).unwrap().0,
        Outcome::Moved
    );
    let cat = read(&etcd, &keys, 0, 0).unwrap();
    assert!(
        cat.buckets.contains_key("bkt") && cat.deleted.is_empty(),
        "{cat:?}"
    );
    assert_eq!(
        commit(&etcd, &keys, &delete(Some(epoch))).unwrap().0,
        Outcome::Done
    );
    let cat = read(&etcd, &keys, 0, 0).unwrap();
    assert!(!cat.buckets.contains_key("bkt"));
    assert_eq!(cat.deleted.keys().collect::<Vec<_>>(), ["bkt"]);
    assert!(cat.deleted["bkt"] > 0);
    assert_eq!(
        commit(&etcd, &keys, &delete(Some(epoch))).unwrap().0,
        Outcome::Missing
    );
    // Made again, the record stays (a node that held the old bucket drops
    // its keys: `catalog::apply`).
    assert_eq!(commit(&etcd, &keys, &create).unwrap().0, Outcome::Done);
    let cat = read(&etcd, &keys, 0, 0).unwrap();
    assert!(cat.buckets.contains_key("bkt") && cat.deleted.contains_key("bkt"));
}
