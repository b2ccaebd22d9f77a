//! The admin endpoint (HTTP, served by the bucket-owner shard): liveness and
//! readiness (`/health/live`, `/health/ready`), the Prometheus scrape
//! (`/metrics`, every shard's snapshot plus process gauges) and the run-time
//! log filter (`GET`/`PUT /log/level`) and `POST /cache/drop` (empties the
//! object caches); writes are guarded by the admin token.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::cluster::catalog::{Change, Outcome};
use crate::frontend::http::{HttpConn, Limits, RequestHead, ResponseHead};
use crate::shard::Shard;

/// Installs a new log filter, or says why it is not one.
pub type LogFilterReload = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Changes the log filter at run time (set once by `main`).
pub static LOG_FILTER_RELOAD: std::sync::OnceLock<LogFilterReload> = std::sync::OnceLock::new();
/// The filter `main` installed, for GET /log/level until changed.
pub static LOG_FILTER_INITIAL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Longest body of a PUT /log/level.
const LOG_FILTER_BYTES_MAX: usize = 4096;

/// 503 on a cluster node whose users are not known current
/// (`catalog::serving`): they are the cluster's, kept in etcd.
fn catalog_busy(shard: &Shard) -> Option<Reply> {
    (shard.is_cluster() && !crate::cluster::catalog::serving()).then(|| {
        (
            503,
            "text/plain",
            b"this cluster node cannot confirm the cluster's users with etcd right now; retry shortly, or through another node\n".to_vec(),
        )
    })
}

/// Where the server is in its life, for /health/ready.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Starting,
    Ready,
    Draining,
}

/// The admin endpoint's view (shard 0): up from before recovery, so that
/// /health/live answers while /health/ready does not yet.
pub struct Admin {
    phase: Cell<Phase>,
    shard: RefCell<Option<Rc<Shard>>>,
    log_filter: RefCell<String>,
    writes: AdminWrites,
}

/// Who may change state through the admin endpoint (PUT /log/level): a
/// request with `Authorization: Bearer <S3 secret key>` (the built-in
/// default secret from loopback peers only, as on the S3 port), or anyone
/// when the operator set `admin_open_writes`. Reads (/health, /metrics,
/// GET /log/level) stay open.
pub struct AdminWrites {
    pub secret_key: String,
    pub default_credentials: bool,
    pub open: bool,
}

/// An admin connection.
type Conn = HttpConn<glommio::net::TcpStream>;

/// A reply: status, content type, body.
type Reply = (u16, &'static str, Vec<u8>);

impl AdminWrites {
    /// None when allowed, else the refusal (status, message).
    fn refusal(&self, head: &RequestHead, loopback: bool) -> Option<(u16, &'static str)> {
        use subtle::ConstantTimeEq;
        // `admin_open_writes` opens the log level and the cache, never the
        // users: minting keys always takes the token.
        if self.open && !head.path.starts_with("/users") {
            return None;
        }
        let Some(value) = head.header_str("authorization") else {
            return Some((
                401,
                "admin writes need 'Authorization: Bearer <PERCORE_SECRET_KEY>' (or admin_open_writes = true)\n",
            ));
        };
        let token = value
            .trim()
            .strip_prefix("Bearer ")
            .map(str::trim)
            .unwrap_or("");
        if !bool::from(token.as_bytes().ct_eq(self.secret_key.as_bytes())) {
            return Some((
                403,
                "wrong admin credentials: send 'Authorization: Bearer <PERCORE_SECRET_KEY>'\n",
            ));
        }
        if self.default_credentials && !loopback {
            return Some((
                403,
                "the default credentials are accepted from loopback only; set PERCORE_ACCESS_KEY and PERCORE_SECRET_KEY\n",
            ));
        }
        None
    }
}

impl Admin {
    /// Starting, with no shard to scrape yet.
    pub fn new(writes: AdminWrites) -> Rc<Admin> {
        Rc::new(Admin {
            phase: Cell::new(Phase::Starting),
            shard: RefCell::new(None),
            log_filter: RefCell::new(LOG_FILTER_INITIAL.get().cloned().unwrap_or_default()),
            writes,
        })
    }

    /// Recovery is over: /health/ready answers 200 and /metrics scrapes
    /// through `shard`.
    pub fn set_ready(&self, shard: Rc<Shard>) {
        *self.shard.borrow_mut() = Some(shard);
        self.phase.set(Phase::Ready);
    }

    /// Shutting down: /health/ready answers 503 again.
    pub fn set_draining(&self) {
        self.phase.set(Phase::Draining);
    }

    /// The endpoint's answer to the request `head`; None closes the
    /// connection (a PUT body that could not be read, or too long).
    async fn route(&self, head: &RequestHead, conn: &mut Conn) -> Option<Reply> {
        Some(match (head.method.as_str(), head.path.as_str()) {
            (_, "/health/live") => (200, "text/plain", b"ok\n".to_vec()),
            (_, "/health/ready") => match self.phase.get() {
                Phase::Ready
                    if self.shard.borrow().as_ref().is_some_and(|s| s.is_cluster())
                        && !crate::cluster::catalog::serving() =>
                {
                    (
                        503,
                        "text/plain",
                        b"cluster: cannot confirm the cluster's buckets with etcd (starting, or etcd unreachable from this node)\n".to_vec(),
                    )
                }
                Phase::Ready => (200, "text/plain", b"ok\n".to_vec()),
                Phase::Starting => (503, "text/plain", b"starting: recovering shards\n".to_vec()),
                Phase::Draining => (503, "text/plain", b"draining: shutting down\n".to_vec()),
            },
            ("GET", "/metrics") => self.metrics().await,
            ("GET", "/log/level") => {
                let current = self.log_filter.borrow().clone();
                (200, "text/plain", format!("{current}\n").into_bytes())
            }
            ("PUT", "/log/level") => self.put_log_level(conn).await?,
            ("POST", "/cache/drop") => self.drop_cache().await,
            ("GET", "/users") => self.users_list(),
            ("POST", path) if path.starts_with("/users/") => self.user_add(&path[7..]).await,
            ("DELETE", path) if path.starts_with("/users/") => self.user_remove(&path[7..]).await,
            _ => (
                404,
                "text/plain",
                b"not found: try /health/live, /health/ready, /metrics, /log/level, POST /cache/drop, /users\n"
                    .to_vec(),
            ),
        })
    }

    /// Every shard's snapshot, rendered, plus the process gauges.
    async fn metrics(&self) -> Reply {
        let shard = self.shard.borrow().clone();
        let Some(shard) = shard else {
            return (
                503,
                "text/plain",
                b"starting: no metrics before recovery ends\n".to_vec(),
            );
        };
        let snaps = shard.metrics_all().await;
        let mut text = crate::metrics::render(&snaps);
        text.push_str(&process_gauges());
        if let Some(cluster) = crate::cluster::control::STATUS.get() {
            text.push_str(&cluster.render());
            if let Some(map) = shard.cluster_map() {
                let now = crate::cluster::control::mono_ms();
                map.render_health(now, &mut text);
                let missed: Vec<(u32, u64, u64)> = snaps
                    .iter()
                    .flat_map(|s| s.replica_missed.iter().copied())
                    .collect();
                map.render_lag(now, &missed, &mut text);
            }
        }
        (200, "text/plain; version=0.0.4", text.into_bytes())
    }

    /// POST /cache/drop: every shard empties its object cache (the next
    /// read of each object goes to the device).
    async fn drop_cache(&self) -> Reply {
        let shard = self.shard.borrow().clone();
        let Some(shard) = shard else {
            return (503, "text/plain", b"starting: no cache yet\n".to_vec());
        };
        let dropped = shard.drop_cache_all().await;
        let status = if dropped == shard.count { 200 } else { 500 };
        (
            status,
            "text/plain",
            format!(
                "object cache dropped on {dropped} of {} shards\n",
                shard.count
            )
            .into_bytes(),
        )
    }

    /// GET /users: every user's name, access key and creation time (not
    /// the secrets), as JSON.
    fn users_list(&self) -> Reply {
        let shard = self.shard.borrow().clone();
        let Some(shard) = shard else {
            return (503, "text/plain", b"starting\n".to_vec());
        };
        if let Some(busy) = catalog_busy(&shard) {
            return busy;
        }
        let list: Vec<serde_json::Value> = shard
            .user_list()
            .iter()
            .map(|u| {
                serde_json::json!({
                    "name": u.name, "access_key": u.access_key, "created_ms": u.created_ms,
                })
            })
            .collect();
        let body = serde_json::to_vec_pretty(&serde_json::json!({ "users": list }))
            .expect("JSON values serialize");
        (200, "application/json", body)
    }

    /// POST /users/NAME: a new user with fresh keys, stored on every shard
    /// before the answer (JSON with the secret: shown this once).
    async fn user_add(&self, name: &str) -> Reply {
        use crate::access::users::{valid_user_name, User};
        let shard = self.shard.borrow().clone();
        let Some(shard) = shard else {
            return (503, "text/plain", b"starting\n".to_vec());
        };
        if let Some(busy) = catalog_busy(&shard) {
            return busy;
        }
        if !valid_user_name(name) {
            return (
                400,
                "text/plain",
                b"user names are 1-64 of A-Z a-z 0-9 _ . @ + = , - (not root)\n".to_vec(),
            );
        }
        let owned = shard.buckets_owned_by(name);
        if !owned.is_empty() && shard.user_by_name(name).is_none() {
            // A new person under a removed user's name would own its
            // buckets and inherit the policies naming it.
            return (
                409,
                "text/plain",
                format!(
                    "the name {name} still owns buckets ({}): delete them (as root) or pick another name\n",
                    owned.join(", ")
                )
                .into_bytes(),
            );
        }
        if shard.user_by_name(name).is_some() {
            return (
                409,
                "text/plain",
                format!("user {name} exists: remove it first to give it new keys\n").into_bytes(),
            );
        }
        let user = User::generate(name, crate::store::now_ms());
        if shard.is_cluster() {
            // Cluster-wide: recorded in etcd, then on every node that is up.
            let change = Change::User {
                name: name.to_string(),
                doc: Some(bytes::Bytes::from(user.to_doc())),
            };
            match self.cluster_change(&shard, change).await {
                Ok(Outcome::Done) => {}
                Ok(_) => {
                    return (
                        409,
                        "text/plain",
                        format!("user {name} exists: remove it first to give it new keys\n")
                            .into_bytes(),
                    )
                }
                Err(reply) => return reply,
            }
        } else if let Err(e) = shard.set_user(name, Some(&user)).await {
            return (
                500,
                "text/plain",
                format!("could not store the user: {e:?}\n").into_bytes(),
            );
        }
        tracing::info!(user = name, access_key = %user.access_key, "user added");
        let body = serde_json::to_vec_pretty(&user).expect("a user serializes");
        (201, "application/json", body)
    }

    /// DELETE /users/NAME: its keys stop working on every shard before
    /// the answer. Its buckets stay (the root principal can still reach
    /// them).
    async fn user_remove(&self, name: &str) -> Reply {
        let shard = self.shard.borrow().clone();
        let Some(shard) = shard else {
            return (503, "text/plain", b"starting\n".to_vec());
        };
        if let Some(busy) = catalog_busy(&shard) {
            return busy;
        }
        if shard.user_by_name(name).is_none() {
            return (404, "text/plain", format!("no user {name}\n").into_bytes());
        }
        if shard.is_cluster() {
            let change = Change::User {
                name: name.to_string(),
                doc: None,
            };
            match self.cluster_change(&shard, change).await {
                Ok(Outcome::Done) => {}
                Ok(_) => return (404, "text/plain", format!("no user {name}\n").into_bytes()),
                Err(reply) => return reply,
            }
        } else if let Err(e) = shard.set_user(name, None).await {
            return (
                500,
                "text/plain",
                format!("could not remove the user: {e:?}\n").into_bytes(),
            );
        }
        tracing::info!(user = name, "user removed");
        (204, "text/plain", Vec::new())
    }

    /// A user change on a cluster node (`catalog::change`); Err: the 503
    /// to answer.
    async fn cluster_change(&self, shard: &Rc<Shard>, change: Change) -> Result<Outcome, Reply> {
        let ckey = crate::cluster::peer_http::cluster_key(&self.writes.secret_key);
        crate::cluster::catalog::change(shard, &ckey, change)
            .await
            .map_err(|e| (503, "text/plain", format!("{e}\n").into_bytes()))
    }

    /// PUT /log/level: the body is the new filter.
    async fn put_log_level(&self, conn: &mut Conn) -> Option<Reply> {
        let mut body = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match conn.read_body(&mut buf).await {
                Ok(0) => break,
                Ok(n) if body.len() + n <= LOG_FILTER_BYTES_MAX => {
                    body.extend_from_slice(&buf[..n])
                }
                _ => return None,
            }
        }
        let filter = String::from_utf8_lossy(&body).trim().to_string();
        Some(match LOG_FILTER_RELOAD.get().map(|f| f(&filter)) {
            Some(Ok(())) => {
                *self.log_filter.borrow_mut() = filter.clone();
                tracing::info!("log filter set to '{filter}'");
                (200, "text/plain", format!("{filter}\n").into_bytes())
            }
            Some(Err(e)) => (
                400,
                "text/plain",
                format!("invalid filter: {e}; use e.g. info, debug or percore_server=debug,info\n")
                    .into_bytes(),
            ),
            None => (
                501,
                "text/plain",
                b"log level cannot be changed in this process\n".to_vec(),
            ),
        })
    }
}

/// Resident memory and open descriptors of the process.
fn process_gauges() -> String {
    let rss_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    // SAFETY: sysconf takes no pointers; an error (-1) reads as 0 below.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).unwrap_or(0);
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    format!(
        "# HELP process_resident_memory_bytes Resident set size.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}\n# HELP process_open_fds Open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {fds}\n",
        rss_pages * page
    )
}

/// Writes a refusal of an admin write; the connection then closes.
async fn write_refusal(conn: &mut Conn, status: u16, message: &str) {
    let mut reply = ResponseHead::new(status).with_header("Content-Type", "text/plain");
    if status == 401 {
        reply.push_header("WWW-Authenticate", "Bearer realm=\"percore-admin\"");
    }
    let _ = conn
        .write_response(&reply, message.len() as u64, true)
        .await;
    let _ = conn.write_body(message.as_bytes()).await;
    let _ = conn.flush().await;
}

/// Serves one admin connection until it closes or a write is refused.
pub async fn serve_connection(admin: Rc<Admin>, stream: glommio::net::TcpStream) {
    let loopback = stream
        .peer_addr()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false);
    let mut conn = HttpConn::new(stream, Limits::default());
    while let Ok(Some(head)) = conn.read_head().await {
        // Refused before any body is read; the connection then closes.
        let refusal = match head.method.as_str() {
            // Users' access keys are read with the admin token too.
            "GET" | "HEAD" if !head.path.starts_with("/users") => None,
            _ => admin.writes.refusal(&head, loopback),
        };
        if let Some((status, message)) = refusal {
            write_refusal(&mut conn, status, message).await;
            break;
        }
        let Some((status, ctype, body)) = admin.route(&head, &mut conn).await else {
            return;
        };
        let head = ResponseHead::new(status).with_header("Content-Type", ctype);
        if conn
            .write_response(&head, body.len() as u64, false)
            .await
            .is_err()
            || conn.write_body(&body).await.is_err()
            || conn.flush().await.is_err()
        {
            break;
        }
    }
}
