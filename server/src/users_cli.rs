//! `percore user add|remove|list`: the admin endpoint's `/users`, over a
//! plain HTTP/1.1 request with the admin token (the root secret key).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct AdminArgs {
    /// The server's admin endpoint.
    #[arg(long, env = "PERCORE_ADMIN", default_value = "127.0.0.1:9300")]
    pub admin: String,
    /// The server's secret key (the admin token; one that starts with
    /// `-` is taken as the value).
    #[arg(
        long,
        env = "PERCORE_SECRET_KEY",
        default_value = "percore-secret",
        hide_env_values = true,
        allow_hyphen_values = true
    )]
    pub secret_key: String,
}

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Add a user with fresh keys; prints them (the secret only this once).
    Add {
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Remove a user: its keys stop working at once; its buckets stay.
    Remove {
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List users (names, access keys, creation times).
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// One request to the admin endpoint; (status, body).
fn call(admin: &AdminArgs, method: &str, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect(&admin.admin).map_err(|e| {
        format!(
            "cannot reach the admin endpoint at {}: {e}; is the server running, and is --admin (PERCORE_ADMIN) its admin address?",
            admin.admin
        )
    })?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        admin.admin, admin.secret_key
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("sending to {}: {e}", admin.admin))?;
    // Head, then exactly Content-Length bytes of body.
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let (head, mut body) = loop {
        let n = stream
            .read(&mut buf)
            .map_err(|e| format!("reading from {}: {e}", admin.admin))?;
        if n == 0 {
            return Err(format!("{} closed the connection early", admin.admin));
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..at]).into_owned();
            break (head, raw[at + 4..].to_vec());
        }
        if raw.len() > 64 * 1024 {
            return Err(format!("{} sent an oversized head", admin.admin));
        }
    };
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while body.len() < length {
        let n = stream
            .read(&mut buf)
            .map_err(|e| format!("reading from {}: {e}", admin.admin))?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&body);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{} did not answer HTTP", admin.admin))?;
    Ok((status, body.to_string()))
}

pub fn run(cmd: UserCommand) -> Result<(), String> {
    if let UserCommand::Add { name, .. } | UserCommand::Remove { name, .. } = &cmd {
        if !percore_server::access::users::valid_user_name(name) {
            return Err(format!(
                "{name:?} is not a user name: 1-64 of A-Z a-z 0-9 _ . @ + = , - (and not root)"
            ));
        }
    }
    let (admin, method, path) = match &cmd {
        UserCommand::Add { name, admin } => (admin, "POST", format!("/users/{name}")),
        UserCommand::Remove { name, admin } => (admin, "DELETE", format!("/users/{name}")),
        UserCommand::List { admin } => (admin, "GET", "/users".to_string()),
    };
    let (status, body) = call(admin, method, &path)?;
    match status {
        200 | 201 => {
            print!("{body}");
            if !body.ends_with('\n') {
                println!();
            }
            if let UserCommand::Add { name, .. } = &cmd {
                eprintln!(
                    "user {name} added: keep the secret_key now, it is not shown again; give it a bucket with CreateBucket under its keys, or a bucket policy naming \"{name}\""
                );
            }
            Ok(())
        }
        204 => {
            eprintln!("removed");
            Ok(())
        }
        401 | 403 => Err(format!(
            "the admin endpoint refused the token ({status}): pass the server's secret key with --secret-key or PERCORE_SECRET_KEY. {}",
            body.trim()
        )),
        _ => Err(format!("{status}: {}", body.trim())),
    }
}
