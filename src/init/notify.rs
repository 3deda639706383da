//! Direct connections that bypass the proxy: seen, reported, refused with a message.
//!
//! The sandbox's network namespace has no route out, so a tool that ignores the proxy
//! variables fails whatever happens here. This adds the explanation: the workload gets a
//! seccomp filter that hands every `connect(2)` to the init (a user notification); a
//! connection to an address outside the sandbox is refused with EACCES, printed once per
//! destination on stderr and written to the audit log as `direct-connect-not-via-proxy`;
//! anything else (loopback, Unix sockets) proceeds. Because the kernel would refuse those
//! connections anyway, the usual time-of-check race of user notifications cannot open a way
//! out: this is reporting, not the enforcement.
//!
//! The filter is installed by the child between fork and exec (so it covers the workload and
//! nothing of the init), which passes the notification descriptor back over a socketpair. That
//! code allocates nothing: everything it touches is prepared before the fork.

use std::collections::HashSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Prepared before the fork.
pub struct Prepared {
    filter: [libc::sock_filter; 6],
    parent: OwnedFd,
    child: OwnedFd,
}

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

pub fn prepare() -> Option<Prepared> {
    let (parent, child) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .ok()?;
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let filter = [
        stmt(ld, 4),                                 // arch
        jump(jeq, super::seccomp::AUDIT_ARCH, 0, 3), // other ABIs: the main filter kills them
        stmt(ld, 0),                                 // syscall number
        jump(jeq, libc::SYS_connect as u32, 0, 1),
        stmt(ret, libc::SECCOMP_RET_USER_NOTIF),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ];
    Some(Prepared {
        filter,
        parent,
        child,
    })
}

/// In the child, after fork and before exec: install the filter and send its notification
/// descriptor to the parent (or a message without one, when the kernel lacks the feature).
/// Async-signal-safe: raw system calls on prepared memory only.
pub fn install_in_child(p: &Prepared) {
    let prog = libc::sock_fprog {
        len: p.filter.len() as u16,
        filter: p.filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at a valid filter for the duration of the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog,
        )
    } as RawFd;
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one descriptor, aligned as a cmsghdr.
    let mut space = [0u64; 4];
    // SAFETY: msghdr is plain data; every pointer in it refers to the stack above.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if fd >= 0 {
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
        libc::sendmsg(p.child.as_raw_fd(), &msg, 0);
        if fd >= 0 {
            libc::close(fd);
        }
    }
}

/// In the parent: the child's notification descriptor, if it could install the filter.
pub fn receive(p: Prepared) -> Option<OwnedFd> {
    drop(p.child);
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let msg = nix::sys::socket::recvmsg::<()>(
        p.parent.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    for c in msg.cmsgs().ok()? {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(fds) = c {
            // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
            return fds.first().map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    None
}

/// Answer notifications until every process under the filter is gone. `proxied`: the network
/// goes through the proxy (the message says so, and the event goes to its audit log).
///
/// `transparent`: the ports the init's transparent relay listens on for any address; a
/// connection to one of them proceeds (the local routes deliver it to the relay, which asks
/// the proxy), the rest are refused here with the explanation.
pub fn serve(fd: OwnedFd, proxied: bool, transparent: Vec<u16>) {
    std::thread::spawn(move || {
        let mut reported: HashSet<SocketAddr> = HashSet::new();
        loop {
            // SAFETY: seccomp_notif is plain data; the kernel fills it.
            let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
            // SAFETY: the ioctl writes one seccomp_notif into `req`.
            let r =
                unsafe { libc::ioctl(fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) };
            if r < 0 {
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) | Some(libc::ENOENT) => continue,
                    _ => return, // no process left under the filter
                }
            }
            let dest = read_sockaddr(&fd, &req);
            let refuse = dest.filter(|a| !is_local(a.ip()) && !transparent.contains(&a.port()));
            let mut resp = libc::seccomp_notif_resp {
                id: req.id,
                val: 0,
                error: 0,
                flags: 0,
            };
            match refuse {
                Some(addr) => {
                    resp.error = -libc::EACCES;
                    if reported.insert(addr) {
                        report(addr, proxied, &transparent);
                    }
                }
                None => resp.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
            }
            // SAFETY: the ioctl reads one seccomp_notif_resp.
            unsafe {
                libc::ioctl(fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &resp);
            }
        }
    });
}

/// The destination of a notified `connect`, when it is an IP address.
fn read_sockaddr(fd: &OwnedFd, req: &libc::seccomp_notif) -> Option<SocketAddr> {
    use std::os::unix::fs::FileExt;
    let (ptr, len) = (req.data.args[1], req.data.args[2] as usize);
    let mut buf = [0u8; 28];
    let len = len.min(buf.len());
    let mem = std::fs::File::open(format!("/proc/{}/mem", req.pid)).ok()?;
    mem.read_exact_at(&mut buf[..len], ptr).ok()?;
    // The pid still names the process that asked (it did not exit and get reused meanwhile).
    let id = req.id;
    // SAFETY: the ioctl reads one u64.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &id) } != 0 {
        return None;
    }
    let family = u16::from_ne_bytes([buf[0], buf[1]]) as i32;
    let port = u16::from_be_bytes([buf[2], buf[3]]);
    match family {
        libc::AF_INET if len >= 8 => Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(buf[4], buf[5], buf[6], buf[7])),
            port,
        )),
        libc::AF_INET6 if len >= 24 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&buf[8..24]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port))
        }
        _ => None,
    }
}

/// Addresses inside the sandbox's own network namespace.
fn is_local(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    ip.is_loopback() || ip.is_unspecified()
}

fn report(addr: SocketAddr, proxied: bool, transparent: &[u16]) {
    let how = if !transparent.is_empty() {
        let ports: Vec<String> = transparent.iter().map(u16::to_string).collect();
        format!(
            "outside the proxy (HTTPS_PROXY=http://127.0.0.1:{}), only ports {} reach allowed names",
            crate::vocab::PROXY_PORT,
            ports.join(", ")
        )
    } else if proxied {
        format!(
            "the network goes through the proxy only (HTTPS_PROXY=http://127.0.0.1:{})",
            crate::vocab::PROXY_PORT
        )
    } else {
        "this sandbox has no network".to_string()
    };
    let _ = writeln!(
        std::io::stderr(),
        "aisb: refused a direct connection to {addr}: {how}"
    );
    if proxied {
        super::relay::report_direct(addr);
    }
}
