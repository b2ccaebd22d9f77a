//! Listing against a model: random keys over the whole Unicode range
//! (U+10FFFF and U+FFFF included), random prefixes, delimiters, page sizes
//! and continuation points, paged to the end and compared with a BTreeMap.
//!
//! Once on the engine (`Store::list`, one shard) and once through the real
//! server at 1, 2 and 4 shards (the merge across shards, native protocol).
//! Every paging loop here is bounded, so a listing that makes no progress
//! fails the test instead of hanging it.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use percore_client::{Client, Config, ListEntry};
use percore_server::store::record::ObjectMeta;
use percore_server::store::{ListItem, Store};
use rand::{rngs::StdRng, Rng, SeedableRng};

mod common;
use common::server::start;
use common::{run, small_config};

const ALPHABET: &[char] = &[
    'a',
    'b',
    '/',
    '-',
    '0',
    '.',
    '\u{1}',
    '\u{7f}',
    'é',
    '\u{7ff}',
    '\u{800}',
    '\u{d7ff}',
    '\u{e000}',
    '\u{fffe}',
    '\u{ffff}',
    '\u{10000}',
    '\u{10fffe}',
    '\u{10ffff}',
];

fn random_string(rng: &mut StdRng, len_max: usize) -> String {
    let len = rng.gen_range(1..=len_max);
    (0..len)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())])
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Object(String),
    Prefix(String),
}

/// What a listing of `keys` must return, from the start, in order.
///
/// S3 (the engine): a marker that ends on a common prefix resumes after all
/// of it. Native (`marker_in_prefix`): so does a marker anywhere inside one.
fn model(
    keys: &BTreeSet<String>,
    prefix: &str,
    start_after: &str,
    delim: &str,
    marker_in_prefix: bool,
) -> Vec<Item> {
    let skip_all_of = match start_after.strip_prefix(prefix) {
        Some(rest) if !delim.is_empty() && !rest.is_empty() => {
            if marker_in_prefix {
                rest.find(delim)
                    .map(|i| &start_after[..prefix.len() + i + delim.len()])
            } else {
                rest.ends_with(delim).then_some(start_after)
            }
        }
        _ => None,
    };
    let mut out: Vec<Item> = Vec::new();
    for key in keys {
        if !key.starts_with(prefix) || key.as_str() <= start_after {
            continue;
        }
        if skip_all_of.is_some_and(|p| key.starts_with(p)) {
            continue;
        }
        let item = match key[prefix.len()..]
            .find(delim)
            .filter(|_| !delim.is_empty())
        {
            Some(pos) => Item::Prefix(key[..prefix.len() + pos + delim.len()].to_string()),
            None => Item::Object(key.clone()),
        };
        if out.last() != Some(&item) {
            out.push(item);
        }
    }
    out
}

struct Query {
    prefix: String,
    start_after: String,
    delim: String,
    page: usize,
}

fn random_query(rng: &mut StdRng, keys: &BTreeSet<String>) -> Query {
    let pick = |rng: &mut StdRng| -> String {
        let all: Vec<&String> = keys.iter().collect();
        if all.is_empty() || rng.gen_bool(0.3) {
            return random_string(rng, 3);
        }
        let k = all[rng.gen_range(0..all.len())];
        let chars: Vec<char> = k.chars().collect();
        chars[..rng.gen_range(0..=chars.len())].iter().collect()
    };
    let prefix = if rng.gen_bool(0.4) {
        String::new()
    } else {
        pick(rng)
    };
    let start_after = if rng.gen_bool(0.5) {
        String::new()
    } else {
        pick(rng)
    };
    let delim = match rng.gen_range(0..6) {
        0 | 1 => String::new(),
        2 => "/".into(),
        3 => "\u{10ffff}".into(),
        4 => "\u{ffff}".into(),
        _ => random_string(rng, 2),
    };
    Query {
        prefix,
        start_after,
        delim,
        page: rng.gen_range(1..8),
    }
}

fn random_keys(rng: &mut StdRng, n: usize) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    // The reported case: a key just past a common prefix's old bound.
    keys.insert("dir/\u{10ffff}x".to_string());
    keys.insert("dir/\u{10ffff}".to_string());
    while keys.len() < n {
        keys.insert(random_string(rng, 6));
    }
    keys
}

#[test]
fn engine_listing_matches_model() {
    for seed in 0..40u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let (store, _) = Store::open(small_config(&path)).await.unwrap();
            let mut keys = random_keys(&mut rng, 60);
            for k in &keys {
                store
                    .put("b", k, ObjectMeta::default(), Bytes::from_static(b"x"))
                    .await
                    .unwrap();
            }
            // Deleted keys must not show (their tombstones are in the index).
            let doomed: Vec<String> = keys.iter().filter(|_| rng.gen_bool(0.2)).cloned().collect();
            for k in doomed {
                assert!(store.delete("b", &k).await.unwrap());
                keys.remove(&k);
            }
            for _ in 0..60 {
                let q = random_query(&mut rng, &keys);
                let expected = model(&keys, &q.prefix, &q.start_after, &q.delim, false);
                let delim = (!q.delim.is_empty()).then_some(q.delim.as_str());
                let mut got: Vec<Item> = Vec::new();
                let mut cursor = q.start_after.clone();
                for _ in 0..=expected.len() + 1 {
                    let page = store.list("b", &q.prefix, &cursor, delim, q.page);
                    got.extend(page.iter().map(|i| match i {
                        ListItem::Prefix(p) => Item::Prefix(p.clone()),
                        ListItem::Object { key, .. } => Item::Object(key.clone()),
                        ListItem::Versions { .. } | ListItem::Skipped(_) => {
                            panic!("{i:?} in a listing without delete markers")
                        }
                    }));
                    match page.last() {
                        Some(last) if page.len() == q.page => cursor = last.name().to_string(),
                        _ => break,
                    }
                }
                assert_eq!(
                    got, expected,
                    "seed {seed}: prefix {:?} after {:?} delimiter {:?} page {}",
                    q.prefix, q.start_after, q.delim, q.page
                );
            }
            store.shutdown().await;
        });
    }
}

async fn server_listing_matches_model(shards: usize) {
    let server = start(shards);
    let mut cfg = Config::new(
        format!("127.0.0.1:{}", server.native),
        "percore",
        "percore-secret",
    );
    cfg.timeout = Duration::from_secs(20);
    let client = Client::connect(cfg).await.unwrap();
    client.create_bucket("lst").await.unwrap();
    let mut rng = StdRng::seed_from_u64(shards as u64);
    let keys = random_keys(&mut rng, 80);
    for k in &keys {
        client
            .put("lst", k, Bytes::from_static(b"x"))
            .await
            .unwrap();
    }
    for round in 0..80 {
        let q = random_query(&mut rng, &keys);
        let expected = model(&keys, &q.prefix, &q.start_after, &q.delim, true);
        let mut got: Vec<Item> = Vec::new();
        let mut cursor = q.start_after.clone();
        let mut pages = 0;
        loop {
            pages += 1;
            assert!(
                pages <= expected.len() + 2,
                "round {round}: listing does not end"
            );
            let page = client
                .list("lst", &q.prefix, &cursor, &q.delim, q.page as u32)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            got.extend(page.entries.iter().map(|e: &ListEntry| {
                if e.is_prefix {
                    Item::Prefix(e.key.clone())
                } else {
                    Item::Object(e.key.clone())
                }
            }));
            if !page.truncated {
                break;
            }
            cursor = page.next_start_after.clone();
        }
        assert_eq!(
            got, expected,
            "{shards} shards, round {round}: prefix {:?} after {:?} delimiter {:?} page {}",
            q.prefix, q.start_after, q.delim, q.page
        );
    }
    // The shard that owns the reported key still serves writes.
    client
        .put("lst", "dir/\u{10ffff}x", Bytes::from_static(b"y"))
        .await
        .unwrap();
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn server_listing_matches_model_1_2_4_shards() {
    for shards in [1, 2, 4] {
        rt().block_on(server_listing_matches_model(shards));
    }
}
