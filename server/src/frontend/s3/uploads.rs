//! ListMultipartUploads' pages: each shard's page of one node merged
//! into the node's, and on a cluster every node's page of the uploads it
//! serves (those of keys whose placement group it leads:
//! `/_percore/list?uploads=1`) merged at the door that took the request,
//! with the paging guarantees of a single node (docs/cluster.md, "S3 on a
//! cluster").
//!
//! A page holds every upload of its source after the markers up to its
//! `frontier` (inclusive); past the frontier the source may hold more.
//! Merged pages end at the least frontier, so nothing before the end of
//! a merged page is missing from it.

use serde_json::{json, Value};

use crate::store::checksum::UploadChecksum;
use crate::store::mpu::UploadItem;

/// Uploads sorted by (key, upload id), and where they stop being whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct UploadPage {
    pub uploads: Vec<UploadItem>,
    /// (key, upload id): the source may hold uploads after it that the
    /// page lacks. None: the page holds every one after the markers.
    pub frontier: Option<(String, String)>,
}

fn place(u: &UploadItem) -> (&str, &str) {
    (&u.key, &u.upload_id)
}

impl UploadPage {
    /// One shard's answer to a listing of at most `max + 1` uploads: a
    /// full one may hold more after its last.
    pub fn of_shard(mut uploads: Vec<UploadItem>, max: usize) -> UploadPage {
        uploads.sort_by(|a, b| place(a).cmp(&place(b)));
        let frontier = (uploads.len() > max)
            .then(|| uploads.last().map(|u| (u.key.clone(), u.upload_id.clone())))
            .flatten();
        UploadPage { uploads, frontier }
    }

    /// Pages of one listing merged: sorted, and cut at the least frontier
    /// (what lies past it is not known to be whole).
    pub fn merge(pages: impl IntoIterator<Item = UploadPage>) -> UploadPage {
        let mut uploads = Vec::new();
        let mut frontier: Option<(String, String)> = None;
        for mut p in pages {
            if let Some(f) = p.frontier {
                if frontier.as_ref().is_none_or(|least| f < *least) {
                    frontier = Some(f);
                }
            }
            uploads.append(&mut p.uploads);
        }
        uploads.sort_by(|a, b| place(a).cmp(&place(b)));
        if let Some((fk, fid)) = &frontier {
            uploads.retain(|u| place(u) <= (fk.as_str(), fid.as_str()));
        }
        UploadPage { uploads, frontier }
    }

    /// A cluster node's part of the page: the uploads whose keys `serves`
    /// (the node leads their groups: another node's leftovers cannot be
    /// reached through any door, whose requests go to the key's primary),
    /// at most `max + 1` of them (then the last is the frontier).
    pub fn own(mut self, serves: impl Fn(&str) -> bool, max: usize) -> UploadPage {
        self.uploads.retain(|u| serves(&u.key));
        if self.uploads.len() > max + 1 {
            self.uploads.truncate(max + 1);
            let last = self.uploads.last().expect("non-empty");
            self.frontier = Some((last.key.clone(), last.upload_id.clone()));
        }
        self
    }

    /// A peer's page checked against the listing it answers: uploads
    /// under `prefix` after the markers only, at most `max + 1`, and a
    /// frontier after the markers (else a client could page forever).
    pub fn check(
        mut self,
        prefix: &str,
        (key_marker, id_marker): (&str, &str),
        max: usize,
    ) -> Result<UploadPage, String> {
        let after = |k: &str, id: &str| {
            key_marker.is_empty()
                || k > key_marker
                || (k == key_marker && !id_marker.is_empty() && id > id_marker)
        };
        if self.uploads.len() > max + 1 {
            return Err(format!(
                "{} uploads for a page of {max}",
                self.uploads.len()
            ));
        }
        if let Some((k, id)) = &self.frontier {
            if !after(k, id) {
                return Err("a frontier before the markers".into());
            }
        }
        self.uploads
            .retain(|u| u.key.starts_with(prefix) && after(&u.key, &u.upload_id));
        Ok(self)
    }

    /// The page as a node's answer: `{"uploads": [[key, upload id,
    /// initiated ms, checksum ("CRC32/COMPOSITE") or null]], "frontier":
    /// [key, upload id] or null}`.
    pub fn to_json(&self) -> Value {
        let uploads: Vec<Value> = self
            .uploads
            .iter()
            .map(|u| {
                json!([
                    u.key,
                    u.upload_id,
                    u.initiated_ms,
                    u.checksum.map(UploadChecksum::encode)
                ])
            })
            .collect();
        json!({"uploads": uploads, "frontier": self.frontier})
    }

    /// A node's answer (`to_json`); Err: why it is not one.
    pub fn from_json(body: &[u8]) -> Result<UploadPage, String> {
        let bad = |what: &str| format!("bad uploads listing: {what}");
        let v: Value = serde_json::from_slice(body).map_err(|e| bad(&e.to_string()))?;
        let text = |v: &Value| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad("not text"))
        };
        let mut uploads = Vec::new();
        for u in v["uploads"].as_array().ok_or_else(|| bad("no uploads"))? {
            let checksum = match &u[3] {
                Value::Null => None,
                Value::String(c) => Some(UploadChecksum::decode(c).ok_or_else(|| bad("checksum"))?),
                _ => return Err(bad("checksum")),
            };
            uploads.push(UploadItem {
                key: text(&u[0])?,
                upload_id: text(&u[1])?,
                initiated_ms: u[2].as_u64().ok_or_else(|| bad("time"))?,
                checksum,
            });
        }
        let frontier = match &v["frontier"] {
            Value::Null => None,
            f => Some((text(&f[0])?, text(&f[1])?)),
        };
        // Sorted as a page is (a peer's order is not trusted).
        Ok(UploadPage::merge([UploadPage { uploads, frontier }]))
    }
}

/// Most pages of uploads a node holds but does not serve that it reads
/// on past in one listing request (`served_page`).
pub(super) const LEFTOVER_PAGES_MAX: usize = 8;

/// A node's part of a cluster listing: `read(key marker, upload id
/// marker)` (its shards' page after the markers) kept to the uploads it
/// serves (`UploadPage::own`). A page of none it serves but with a
/// frontier (all leftovers of keys another node leads) is read on from
/// its frontier, at most `LEFTOVER_PAGES_MAX` pages, so that a run of
/// leftovers does not make clients page through empty pages.
pub(super) async fn served_page<F, Fut, E>(
    mut read: F,
    (key_marker, id_marker): (&str, &str),
    serves: impl Fn(&str) -> bool,
    max: usize,
) -> Result<UploadPage, E>
where
    F: FnMut(String, String) -> Fut,
    Fut: std::future::Future<Output = Result<UploadPage, E>>,
{
    let mut page = read(key_marker.to_string(), id_marker.to_string())
        .await?
        .own(&serves, max);
    for _ in 1..LEFTOVER_PAGES_MAX {
        match &page.frontier {
            // Everything up to the frontier is a leftover: read on after
            // it (upload ids are never empty, so strictly after).
            Some((k, id)) if page.uploads.is_empty() => {
                page = read(k.clone(), id.clone()).await?.own(&serves, max);
            }
            _ => break,
        }
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(key: &str, id: &str) -> UploadItem {
        UploadItem {
            key: key.into(),
            upload_id: id.into(),
            initiated_ms: 7,
            checksum: None,
        }
    }

    #[test]
    fn a_peer_page_keeps_what_its_listing_asked_for() {
        let page = |keys: &[(&str, &str)], frontier: Option<(&str, &str)>| UploadPage {
            uploads: keys.iter().map(|(k, id)| upload(k, id)).collect(),
            frontier: frontier.map(|(k, id)| (k.to_string(), id.to_string())),
        };
        let got = page(
            &[
                ("a", "1"),
                ("p/a", "1"),
                ("p/b", "1"),
                ("p/b", "2"),
                ("q", "1"),
            ],
            None,
        )
        .check("p/", ("p/b", "1"), 10)
        .unwrap();
        let kept: Vec<(&str, &str)> = got.uploads.iter().map(place).collect();
        assert_eq!(kept, vec![("p/b", "2")]);
        // A key marker alone: the key itself is not after it.
        let got = page(&[("p/b", "1"), ("p/c", "1")], None)
            .check("", ("p/b", ""), 10)
            .unwrap();
        assert_eq!(got.uploads.len(), 1);
        // Too many, or a frontier at or before the markers: refused.
        assert!(page(&[("a", "1"), ("b", "1"), ("c", "1")], None)
            .check("", ("", ""), 1)
            .is_err());
        assert!(page(&[], Some(("p/b", "1")))
            .check("", ("p/b", "1"), 5)
            .is_err());
        assert!(page(&[], Some(("", ""))).check("", ("a", ""), 5).is_err());
        assert!(page(&[], Some(("p/b", "2")))
            .check("", ("p/b", "1"), 5)
            .is_ok());
    }

    /// A run of leftovers is read on past, at most LEFTOVER_PAGES_MAX
    /// pages: an upload served after fewer comes back; after more, an
    /// empty page with a frontier further on (the client goes on there).
    #[test]
    fn a_node_reads_on_past_a_run_of_leftovers() {
        for (leftovers, found) in [(0, true), (20, true), (23, true), (24, false), (40, false)] {
            let max = 2;
            let mut all: Vec<UploadItem> = (0..leftovers)
                .map(|i| upload(&format!("k{i:03}"), "left"))
                .collect();
            all.push(upload("z", "mine"));
            let reads = std::cell::Cell::new(0);
            let read = |k: String, id: String| {
                reads.set(reads.get() + 1);
                let mut v: Vec<UploadItem> = all
                    .iter()
                    .filter(|u| k.is_empty() || place(u) > (k.as_str(), id.as_str()))
                    .cloned()
                    .collect();
                v.truncate(max + 1);
                std::future::ready(Ok::<_, ()>(UploadPage::of_shard(v, max)))
            };
            let page = futures::executor::block_on(served_page(read, ("", ""), |k| k == "z", max))
                .unwrap();
            assert!(
                reads.get() <= LEFTOVER_PAGES_MAX,
                "{leftovers}: {} reads",
                reads.get()
            );
            if found {
                assert_eq!(page.uploads, vec![upload("z", "mine")], "{leftovers}");
            } else {
                assert!(page.uploads.is_empty(), "{leftovers}");
                let (k, _) = page.frontier.clone().unwrap();
                assert_eq!(
                    k,
                    format!("k{:03}", LEFTOVER_PAGES_MAX * (max + 1) - 1),
                    "{leftovers}"
                );
            }
        }
    }

    #[test]
    fn a_page_travels_whole_and_bad_answers_are_refused() {
        let mut page = UploadPage::of_shard(vec![upload("b", "2"), upload("a\"\u{1}é", "1")], 5);
        page.uploads[1].checksum = UploadChecksum::decode("CRC32/COMPOSITE");
        assert!(page.uploads[1].checksum.is_some());
        page.frontier = Some(("b".into(), "2".into()));
        let back = UploadPage::from_json(page.to_json().to_string().as_bytes()).unwrap();
        assert_eq!(back, page);
        for bad in [
            r#"{}"#,
            r#"{"uploads": [[1, "x", 1, null]], "frontier": null}"#,
            r#"{"uploads": [["k", "x", -1, null]], "frontier": null}"#,
            r#"{"uploads": [["k", "x", 1, "CRC99/COMPOSITE"]], "frontier": null}"#,
            r#"{"uploads": [], "frontier": ["k"]}"#,
        ] {
            assert!(UploadPage::from_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    /// Uploads spread over nodes and shards, each node serving some keys
    /// only (and holding leftovers of others): paging through merged
    /// pages of any size lists every upload some node serves, once, in
    /// order (as one sorted list paged by its markers would).
    #[test]
    fn merged_pages_list_every_served_upload_once_in_order() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(18);
        for round in 0..400 {
            let max = rng.gen_range(1..6);
            let count = rng.gen_range(0..60);
            // (node, shard, upload): node n serves key kNN if NN % 3 == n.
            let mut all: Vec<(usize, usize, UploadItem)> = (0..count)
                .map(|_| {
                    let key = format!("k{:02}", rng.gen_range(0..12));
                    let id = rng.gen_range(0..4).to_string();
                    (rng.gen_range(0..3), rng.gen_range(0..2), upload(&key, &id))
                })
                .collect();
            all.sort_by(|a, b| place(&a.2).cmp(&place(&b.2)));
            all.dedup_by(|a, b| place(&a.2) == place(&b.2));
            let serves = |node: usize, key: &str| key[1..].parse::<usize>().unwrap() % 3 == node;
            let want: Vec<(String, String)> = all
                .iter()
                .filter(|(n, _, u)| serves(*n, &u.key))
                .map(|(_, _, u)| (u.key.clone(), u.upload_id.clone()))
                .collect();
            let mut got: Vec<(String, String)> = Vec::new();
            let mut marker: Option<(String, String)> = None;
            for _ in 0..200 {
                let pages = (0..3).map(|node| {
                    // The node's shards' page after the markers it reads
                    // from (it reads on past leftovers: `served_page`).
                    let read = |k: String, id: String| {
                        let shards = (0..2).map(|shard| {
                            let mut v: Vec<UploadItem> = all
                                .iter()
                                .filter(|(n, s, u)| {
                                    *n == node
                                        && *s == shard
                                        && (k.is_empty() || place(u) > (k.as_str(), id.as_str()))
                                })
                                .map(|(_, _, u)| u.clone())
                                .collect();
                            v.truncate(max + 1);
                            UploadPage::of_shard(v, max)
                        });
                        std::future::ready(Ok::<_, ()>(UploadPage::merge(shards)))
                    };
                    let (k, id) = marker.clone().unwrap_or_default();
                    let page = futures::executor::block_on(served_page(
                        read,
                        (&k, &id),
                        |k| serves(node, k),
                        max,
                    ))
                    .unwrap();
                    // Through the wire, as a peer's answer.
                    UploadPage::from_json(page.to_json().to_string().as_bytes()).unwrap()
                });
                let page = UploadPage::merge(pages);
                let mut shown = page.uploads.clone();
                let truncated = shown.len() > max || page.frontier.is_some();
                shown.truncate(max);
                got.extend(shown.iter().map(|u| (u.key.clone(), u.upload_id.clone())));
                if !truncated {
                    break;
                }
                // After the last shown if `max` cut the page, else after
                // its frontier (what some node has not shown yet).
                marker = Some(if page.uploads.len() > max {
                    let last = shown.last().unwrap();
                    (last.key.clone(), last.upload_id.clone())
                } else {
                    page.frontier.clone().unwrap()
                });
            }
            assert_eq!(got, want, "round {round}, max {max}");
        }
    }
}
