//! `percore doctor`: what this machine offers percore, each finding with its
//! fix. Reads only; changes nothing.

use std::fmt::Write as _;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Info,
    Warn,
    Fail,
}

impl Level {
    fn tag(self) -> &'static str {
        match self {
            Level::Ok => "ok  ",
            Level::Info => "info",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        }
    }
}

pub struct Finding {
    pub level: Level,
    pub topic: &'static str,
    pub what: String,
    /// What to do about it (empty when nothing).
    pub fix: String,
}

fn finding(
    level: Level,
    topic: &'static str,
    what: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        level,
        topic,
        what: what.into(),
        fix: fix.into(),
    }
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn kernel() -> Vec<Finding> {
    // SAFETY: utsname is plain C arrays, valid all-zero.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname. On failure it stays zeroed
    // and the release reads as "" below.
    unsafe { libc::uname(&mut u) };
    // SAFETY: `release` is NUL-terminated: by the kernel, or all zeros.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .to_string();
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    let level = if (major, minor) >= (6, 0) {
        Level::Ok
    } else {
        Level::Warn
    };
    vec![finding(
        level,
        "kernel",
        format!("Linux {release}"),
        if level == Level::Ok {
            ""
        } else {
            "SEND_ZC needs 6.0+ and its copy reporting 6.2+; upgrade the kernel"
        },
    )]
}

fn io_uring_features() -> Vec<Finding> {
    let mut out = Vec::new();
    if let Err(e) = crate::boot::checks::io_uring_enabled() {
        out.push(finding(
            Level::Fail,
            "io_uring",
            e,
            "percore cannot run without io_uring",
        ));
        return out;
    }
    let ring = match io_uring::IoUring::new(8) {
        Ok(r) => r,
        Err(e) => {
            out.push(finding(
                Level::Fail,
                "io_uring",
                format!("cannot create a ring: {e}"),
                "check kernel.io_uring_disabled and seccomp",
            ));
            return out;
        }
    };
    let mut probe = io_uring::Probe::new();
    if ring.submitter().register_probe(&mut probe).is_err() {
        out.push(finding(
            Level::Warn,
            "io_uring",
            "the kernel does not answer opcode probes",
            "upgrade to Linux 6.x",
        ));
        return out;
    }
    use io_uring::opcode;
    for (name, code, why) in [
        (
            "READ_FIXED",
            opcode::ReadFixed::CODE,
            "DMA reads into registered buffers",
        ),
        (
            "WRITE_FIXED",
            opcode::WriteFixed::CODE,
            "writes from registered buffers",
        ),
        (
            "SEND_ZC",
            opcode::SendZc::CODE,
            "zero-copy sends (kernel 6.0+)",
        ),
        ("SEND", opcode::Send::CODE, "plain sends on the ring"),
    ] {
        let ok = probe.is_supported(code);
        out.push(finding(
            if ok { Level::Ok } else { Level::Warn },
            "io_uring",
            format!(
                "{name} {}: {why}",
                if ok { "supported" } else { "NOT supported" }
            ),
            if ok {
                ""
            } else {
                "upgrade the kernel; percore falls back to copying"
            },
        ));
    }
    let sqpoll: std::io::Result<io_uring::IoUring> =
        io_uring::IoUring::builder().setup_sqpoll(1000).build(8);
    out.push(match sqpoll {
        Ok(_) => finding(
            Level::Ok,
            "io_uring",
            "SQPOLL available (off by default; worth it with spare cores)",
            "",
        ),
        Err(e) => finding(
            Level::Info,
            "io_uring",
            format!("SQPOLL unavailable: {e}"),
            "SQPOLL needs root or CAP_SYS_NICE on older kernels; percore runs without it",
        ),
    });
    out
}

fn memory() -> Vec<Finding> {
    let mut out = Vec::new();
    let memlock = crate::boot::checks::memlock_bytes();
    // SAFETY: geteuid takes no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    out.push(if memlock == u64::MAX {
        finding(Level::Ok, "memlock", "RLIMIT_MEMLOCK unlimited", "")
    } else if root {
        finding(
            Level::Info,
            "memlock",
            format!("RLIMIT_MEMLOCK {} KiB, but running as root: io_uring does not enforce it (CAP_IPC_LOCK)", memlock >> 10),
            "as a service user, set LimitMEMLOCK=infinity in the systemd unit",
        )
    } else if memlock >= 256 << 20 {
        finding(Level::Ok, "memlock", format!("RLIMIT_MEMLOCK {} MiB", memlock >> 20), "")
    } else {
        finding(
            Level::Warn,
            "memlock",
            format!("RLIMIT_MEMLOCK {} KiB: registered buffers (65 MiB per shard) may not fit; the shards fall back to the copy path", memlock >> 10),
            "set LimitMEMLOCK=infinity in the systemd unit, or `ulimit -l unlimited`",
        )
    });
    let meminfo = read("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (total, free, size_kb) = (
        field("HugePages_Total:"),
        field("HugePages_Free:"),
        field("Hugepagesize:"),
    );
    out.push(if total > 0 {
        finding(
            Level::Ok,
            "hugepages",
            format!("{total} huge pages of {size_kb} KiB reserved, {free} free"),
            "",
        )
    } else {
        finding(
            Level::Info,
            "hugepages",
            "no huge pages reserved: buffer pools use 4 KiB pages",
            "reserve them: sysctl vm.nr_hugepages=<33 per shard for the 65 MiB pools>",
        )
    });
    out
}

fn cpu_plan(shards: Option<usize>, cpus: Option<&[usize]>) -> Vec<Finding> {
    let mut out = Vec::new();
    match crate::boot::topology::physical_cores() {
        Err(e) => out.push(finding(
            Level::Fail,
            "cpus",
            e,
            "install libhwloc and check /sys is mounted",
        )),
        Ok(cores) => {
            let nodes: std::collections::BTreeSet<Option<usize>> =
                cores.iter().map(|c| c.1).collect();
            out.push(finding(
                Level::Info,
                "cpus",
                format!(
                    "{} physical cores on {} NUMA node(s); {} CPUs online",
                    cores.len(),
                    nodes.len(),
                    num_cpus_online()
                ),
                "",
            ));
            match crate::boot::topology::plan(&cores, cpus, shards, false) {
                Ok(plan) => {
                    let mut line = String::new();
                    for p in &plan {
                        let _ = write!(
                            line,
                            "{}→cpu{}{} ",
                            p.shard,
                            p.cpu.unwrap_or(0),
                            p.numa_node.map(|n| format!("/n{n}")).unwrap_or_default()
                        );
                    }
                    out.push(finding(
                        Level::Ok,
                        "cpus",
                        format!("shard plan: {}", line.trim_end()),
                        "",
                    ));
                }
                Err(e) => out.push(finding(Level::Warn, "cpus", e, "")),
            }
        }
    }
    out
}

fn num_cpus_online() -> usize {
    // SAFETY: sysconf takes no pointers; -1 (error) becomes 1 below.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(online.max(1)).unwrap_or(1)
}

/// Parses a hex CPU mask ("00000000,0000000f") into CPU numbers.
fn parse_mask(mask: &str) -> Vec<usize> {
    let hex: String = mask.trim().chars().filter(|c| *c != ',').collect();
    let mut out = Vec::new();
    for (i, c) in hex.chars().rev().enumerate() {
        let v = c.to_digit(16).unwrap_or(0);
        for b in 0..4 {
            if v & (1 << b) != 0 {
                out.push(i * 4 + b);
            }
        }
    }
    out
}

fn nics(shard_cpus: &[usize]) -> Vec<Finding> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return out;
    };
    let interrupts = read("/proc/interrupts").unwrap_or_default();
    let mut names: Vec<String> = dir
        .filter_map(|d| d.ok())
        .map(|d| d.file_name().to_string_lossy().to_string())
        .filter(|n| Path::new(&format!("/sys/class/net/{n}/device")).exists())
        .collect();
    names.sort();
    if names.is_empty() {
        out.push(finding(Level::Info, "nic", "no physical NICs (only virtual interfaces): zero-copy sends will be reported as copied", "run on bare metal with a real NIC to use SEND_ZC"));
        return out;
    }
    for name in names {
        let speed = read(format!("/sys/class/net/{name}/speed"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let queues: Vec<String> = std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let rx = queues.iter().filter(|q| q.starts_with("rx-")).count();
        let tx = queues.iter().filter(|q| q.starts_with("tx-")).count();
        out.push(finding(
            Level::Info,
            "nic",
            format!("{name}: {speed} Mb/s, {rx} rx / {tx} tx queues"),
            "",
        ));
        // IRQs of this NIC and where they go.
        let mut irq_cpus = std::collections::BTreeSet::new();
        let mut irqs = 0;
        for line in interrupts.lines().filter(|l| l.contains(name.as_str())) {
            let Some(irq) = line.split(':').next().map(str::trim) else {
                continue;
            };
            if let Some(list) = read(format!("/proc/irq/{irq}/smp_affinity_list")) {
                irqs += 1;
                if let Ok(cpus) = crate::boot::topology::parse_cpu_list(list.trim()) {
                    irq_cpus.extend(cpus);
                }
            }
        }
        if irqs > 0 {
            let outside: Vec<usize> = irq_cpus
                .iter()
                .copied()
                .filter(|c| !shard_cpus.contains(c))
                .collect();
            out.push(if irqs >= rx.min(shard_cpus.len()) && outside.is_empty() {
                finding(Level::Ok, "nic", format!("{name}: {irqs} IRQs on shard CPUs {irq_cpus:?}"), "")
            } else {
                finding(
                    Level::Warn,
                    "nic",
                    format!("{name}: {irqs} IRQs on CPUs {irq_cpus:?}; shard CPUs are {shard_cpus:?}"),
                    "pin each queue's IRQ to the CPU of one shard: echo CPU > /proc/irq/N/smp_affinity_list (and stop irqbalance)",
                )
            });
        }
        let mut xps_unset = 0;
        for q in queues.iter().filter(|q| q.starts_with("tx-")) {
            match read(format!("/sys/class/net/{name}/queues/{q}/xps_cpus")) {
                Some(m) if !parse_mask(&m).is_empty() => {}
                _ => xps_unset += 1,
            }
        }
        if tx > 0 {
            out.push(if xps_unset == 0 {
                finding(Level::Ok, "nic", format!("{name}: XPS set on all {tx} tx queues"), "")
            } else {
                finding(
                    Level::Warn,
                    "nic",
                    format!("{name}: XPS unset on {xps_unset} of {tx} tx queues"),
                    "map each tx queue to its shard's CPU: echo MASK > /sys/class/net/DEV/queues/tx-N/xps_cpus",
                )
            });
        }
    }
    out
}

fn filesystem_name(magic: i64) -> &'static str {
    match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x2FC1_2FC1 => "zfs",
        0x6969 => "nfs",
        _ => "other",
    }
}

fn data_dir(dir: &Path) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Err(e) = crate::boot::checks::data_dir_writable(dir) {
        out.push(finding(Level::Fail, "disk", e, ""));
        return out;
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: statfs is plain integers, valid all-zero.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statfs; `st`
    // is read only when the call succeeded.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0 {
        let fs = filesystem_name(st.f_type as i64);
        let free = st.f_bavail as u64 * st.f_bsize as u64;
        let level = if matches!(fs, "ext4" | "xfs") {
            Level::Ok
        } else {
            Level::Warn
        };
        out.push(finding(
            level,
            "disk",
            format!("{}: {fs}, {} GiB free", dir.display(), free >> 30),
            if level == Level::Ok {
                ""
            } else {
                "use ext4 or XFS on local NVMe for the data directory"
            },
        ));
    }
    out.push(match crate::store::file::probe_direct_io(dir) {
        Ok(true) => finding(Level::Ok, "disk", "O_DIRECT works in the data directory", ""),
        Ok(false) => finding(Level::Warn, "disk", "O_DIRECT is not supported here: percore falls back to buffered I/O and the data ring's READ_FIXED path is off", "put the data directory on ext4 or XFS"),
        Err(e) => finding(Level::Warn, "disk", format!("O_DIRECT probe failed: {e}"), ""),
    });
    out
}

/// Runs every check; returns the report text and the worst level.
pub fn run(dir: &Path, shards: Option<usize>, cpus: Option<&[usize]>) -> (String, Level) {
    let mut all = Vec::new();
    all.extend(kernel());
    all.extend(io_uring_features());
    all.extend(memory());
    all.extend(cpu_plan(shards, cpus));
    let shard_cpus: Vec<usize> = crate::boot::topology::physical_cores()
        .ok()
        .and_then(|cores| crate::boot::topology::plan(&cores, cpus, shards, false).ok())
        .map(|p| p.iter().filter_map(|s| s.cpu).collect())
        .unwrap_or_default();
    all.extend(nics(&shard_cpus));
    all.extend(data_dir(dir));
    let mut text = String::new();
    for f in &all {
        let _ = writeln!(text, "[{}] {:<9} {}", f.level.tag(), f.topic, f.what);
        if !f.fix.is_empty() {
            let _ = writeln!(text, "       {:<9} fix: {}", "", f.fix);
        }
    }
    let worst = all.iter().map(|f| f.level).max().unwrap_or(Level::Ok);
    (text, worst)
}

#[cfg(test)]
mod tests {
    #[test]
    fn masks() {
        assert_eq!(super::parse_mask("00000000,0000000f"), vec![0, 1, 2, 3]);
        assert_eq!(super::parse_mask("10"), vec![4]);
        assert!(super::parse_mask("0").is_empty());
    }
}
