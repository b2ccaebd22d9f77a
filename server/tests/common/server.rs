//! The real `percore serve` binary for integration tests: started on a
//! fresh data directory with ephemeral ports, killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub native: u16,
    pub admin: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn start(shards: usize) -> Server {
    start_with(shards, &[])
}

/// `start` with extra environment variables for the server.
pub fn start_with(shards: usize, env: &[(&str, &str)]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let (child, native, admin) = spawn(dir.path(), shards, env, &[]);
    Server {
        child,
        native,
        admin,
        _dir: dir,
    }
}

/// Starts `percore serve` on `data` with `shards` unpinned shards, ephemeral
/// S3, admin and (unless `args` name one) native ports, the built-in
/// credentials, and extra `env` and `args`; returns once it is ready, with
/// its native and admin ports.
pub fn spawn(
    data: &std::path::Path,
    shards: usize,
    env: &[(&str, &str)],
    args: &[&str],
) -> (Child, u16, u16) {
    let admin = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_percore"));
    cmd.args(["serve", "--unpinned", "--shards", &shards.to_string()])
        .arg("--data")
        .arg(data)
        .args(["--s3", &format!("127.0.0.1:{}", free_port())])
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .args(args);
    if !args.contains(&"--native") {
        cmd.args(["--native", "127.0.0.1:0"]);
    }
    cmd.env_remove("PERCORE_ACCESS_KEY")
        .env_remove("PERCORE_SECRET_KEY")
        .env("PERCORE_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn percore serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut native = 0;
    let mut ready = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(rest) = line.strip_prefix("native endpoint: 127.0.0.1:") {
            native = rest.split_whitespace().next().unwrap().parse().unwrap();
        }
        if line.contains("percore: ready") {
            ready = true;
            break;
        }
    }
    assert!(
        ready && native > 0,
        "the server did not start (no ready line and native port)"
    );
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, native, admin)
}
