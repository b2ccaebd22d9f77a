//! CPU-steered listeners: one SO_REUSEPORT socket per shard, bound in shard
//! order (socket i of the group is shard i's), with a classic BPF program
//! attached through SO_ATTACH_REUSEPORT_CBPF that picks the socket of the
//! shard pinned to the CPU handling the connection's packets. With NIC
//! queue IRQs pinned to shard CPUs, a connection is accepted on the core
//! that receives its packets. Any other CPU falls back to `cpu % shards`;
//! a connection on an "unexpected" shard still works (requests are routed
//! by key).

use std::net::SocketAddr;
use std::os::fd::RawFd;

const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
// Classic BPF opcodes (linux/filter.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
const BPF_RET_A: u16 = 0x16;
const BPF_ALU_MOD_K: u16 = 0x94;
/// SKF_AD_OFF + SKF_AD_CPU: "load the current CPU".
const SKF_AD_CPU: u32 = 0xFFFF_F000 + 36;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The program: the socket index of the shard pinned to the current CPU,
/// else `cpu % shards`.
pub fn program(shard_cpus: &[usize]) -> Vec<libc::sock_filter> {
    let mut p = vec![insn(BPF_LD_W_ABS, 0, 0, SKF_AD_CPU)];
    for (shard, &cpu) in shard_cpus.iter().enumerate() {
        p.push(insn(BPF_JMP_JEQ_K, 0, 1, cpu as u32));
        p.push(insn(BPF_RET_K, 0, 0, shard as u32));
    }
    p.push(insn(BPF_ALU_MOD_K, 0, 0, shard_cpus.len() as u32));
    p.push(insn(BPF_RET_A, 0, 0, 0));
    p
}

fn last_error(what: &str, addr: SocketAddr) -> String {
    format!("{what} {addr}: {}", std::io::Error::last_os_error())
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain integers, valid all-zero.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any
            // sockaddr, sockaddr_in included.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn bound_port(fd: RawFd) -> Option<u16> {
    // SAFETY: sockaddr_storage is plain integers, valid all-zero.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `storage` and `len` are writable and `len` is its size, so the
    // kernel writes at most that many bytes.
    if unsafe { libc::getsockname(fd, &mut storage as *mut _ as *mut libc::sockaddr, &mut len) }
        != 0
    {
        return None;
    }
    let family = storage.ss_family as libc::c_int;
    Some(if family == libc::AF_INET {
        // SAFETY: the family says the storage holds a sockaddr_in, which
        // fits in (and is aligned by) sockaddr_storage.
        let sin = unsafe { &*(&storage as *const _ as *const libc::sockaddr_in) };
        u16::from_be(sin.sin_port)
    } else {
        // SAFETY: not AF_INET: a socket of this module is then AF_INET6,
        // and a sockaddr_in6 fits in (and is aligned by) sockaddr_storage.
        let sin6 = unsafe { &*(&storage as *const _ as *const libc::sockaddr_in6) };
        u16::from_be(sin6.sin6_port)
    })
}

/// Binds one listening socket per shard on `addr`, in shard order. When
/// every shard is pinned (`shard_cpus` has one CPU per shard), attaches the
/// steering program and returns true.
pub fn bind_group(
    addr: SocketAddr,
    shards: usize,
    shard_cpus: Option<&[usize]>,
) -> Result<(Vec<RawFd>, bool), String> {
    let mut fds = Vec::with_capacity(shards);
    let mut addr = addr;
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let close_all = |fds: &[RawFd]| {
        for &fd in fds {
            // SAFETY: each fd was created by this call and is not shared yet.
            unsafe { libc::close(fd) };
        }
    };
    for _ in 0..shards {
        // SAFETY: socket takes no pointers; the result is checked below.
        let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            close_all(&fds);
            return Err(last_error("cannot create a socket for", addr));
        }
        fds.push(fd);
        let one: libc::c_int = 1;
        for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
            // SAFETY: `one` is a live c_int and the length is its size.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    &one as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
        }
        let (sa, len) = sockaddr(addr);
        // SAFETY: `sa` holds a sockaddr of `len` bytes (built by `sockaddr`).
        if unsafe { libc::bind(fd, &sa as *const _ as *const libc::sockaddr, len) } != 0 {
            let e = last_error("cannot listen on", addr);
            close_all(&fds);
            return Err(e);
        }
        // SAFETY: listen takes no pointers; `fd` is our bound socket.
        if unsafe { libc::listen(fd, 1024) } != 0 {
            let e = last_error("cannot listen on", addr);
            close_all(&fds);
            return Err(e);
        }
        // Port 0: the first socket picks the port, the others join it.
        if addr.port() == 0 {
            if let Some(p) = bound_port(fd) {
                addr.set_port(p);
            }
        }
    }
    let steered = match shard_cpus {
        Some(cpus) if cpus.len() == shards && shards > 1 => {
            let prog = program(cpus);
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            // SAFETY: `fprog` points at `prog`, which outlives the call (the
            // kernel copies the program), and the length is its size.
            let rc = unsafe {
                libc::setsockopt(
                    fds[0],
                    libc::SOL_SOCKET,
                    SO_ATTACH_REUSEPORT_CBPF,
                    &fprog as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                tracing::warn!(
                    "SO_ATTACH_REUSEPORT_CBPF failed ({}): connections are spread by the kernel's hash",
                    std::io::Error::last_os_error()
                );
            }
            rc == 0
        }
        _ => false,
    };
    Ok((fds, steered))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_maps_cpus_to_socket_indexes() {
        let p = program(&[4, 6]);
        assert_eq!(p.len(), 1 + 2 * 2 + 2);
        assert_eq!((p[0].code, p[0].k), (BPF_LD_W_ABS, SKF_AD_CPU));
        assert_eq!(
            (p[1].code, p[1].k, p[1].jt, p[1].jf),
            (BPF_JMP_JEQ_K, 4, 0, 1)
        );
        assert_eq!((p[2].code, p[2].k), (BPF_RET_K, 0));
        assert_eq!((p[3].code, p[3].k), (BPF_JMP_JEQ_K, 6));
        assert_eq!((p[4].code, p[4].k), (BPF_RET_K, 1));
        assert_eq!((p[5].code, p[5].k), (BPF_ALU_MOD_K, 2));
        assert_eq!(p[6].code, BPF_RET_A);
    }

    #[test]
    fn group_binds_one_port_and_accepts_the_program() {
        let (fds, steered) =
            bind_group("127.0.0.1:0".parse().unwrap(), 3, Some(&[0, 0, 0])).unwrap();
        let ports: Vec<_> = fds.iter().map(|&fd| bound_port(fd).unwrap()).collect();
        assert!(ports.iter().all(|p| *p == ports[0] && *p != 0), "{ports:?}");
        assert!(steered, "the kernel refused the steering program");
        for fd in fds {
            // SAFETY: the test owns these fds and closes each once.
            unsafe { libc::close(fd) };
        }
    }
}
