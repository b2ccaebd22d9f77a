//! Start-up checks, each failing with what to do about it.

use std::path::Path;

/// io_uring can be switched off by sysctl (kernel.io_uring_disabled).
pub fn io_uring_enabled() -> Result<(), String> {
    match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        Ok(v) if v.trim() == "2" => Err(
            "io_uring is disabled on this machine (kernel.io_uring_disabled = 2); \
             enable it with `sysctl -w kernel.io_uring_disabled=0`"
                .into(),
        ),
        // SAFETY: geteuid takes no arguments and cannot fail.
        Ok(v) if v.trim() == "1" && unsafe { libc::geteuid() } != 0 => {
            Err("io_uring is restricted to root and the \
             io_uring_group (kernel.io_uring_disabled = 1); run as a member of that group or set \
             `sysctl -w kernel.io_uring_disabled=0`"
                .into())
        }
        _ => {
            // Creating a ring is the real test.
            io_uring::IoUring::new(2).map(|_| ()).map_err(|e| format!("cannot create an io_uring ring: {e}; percore needs a Linux 5.19+ kernel with io_uring enabled"))
        }
    }
}

/// RLIMIT_MEMLOCK in bytes (u64::MAX when unlimited).
pub fn memlock_bytes() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return u64::MAX;
    }
    r.rlim_cur
}

/// Registered I/O memory per shard, within the memlock limit.
pub fn io_memory_per_shard(shards: usize) -> Result<usize, String> {
    const WANTED: u64 = 10 << 20;
    const MINIMUM: u64 = 512 << 10;
    let limit = memlock_bytes();
    let per_shard = (limit / (shards as u64 + 1)).min(WANTED);
    if per_shard < MINIMUM {
        return Err(format!(
            "RLIMIT_MEMLOCK is {} KiB, too low for {shards} shards (each needs at least 512 KiB of locked memory); \
             raise it with `ulimit -l unlimited` or LimitMEMLOCK=infinity in the systemd unit",
            limit / 1024
        ));
    }
    Ok(per_shard as usize)
}

/// Creates the data directory and proves it is writable.
pub fn data_dir_writable(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", dir.display()))?;
    let probe = dir.join(".percore-write-probe");
    std::fs::write(&probe, b"ok").map_err(|e| {
        format!(
            "data directory {} is not writable: {e}; fix its ownership or pick another with --data",
            dir.display()
        )
    })?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}
