//! Escape probes for the isolation scenarios in `vm-tests/` (a test tool: it runs inside a
//! sandbox, on the host or in a testbed VM where there is no Python). Each probe attempts one
//! thing and exits 0 when it succeeded, 1 when the kernel refused it, 127 on bad usage (the runner
//! counts 126 and 127 as "the attempt could not run", never as a refusal).
//!
//!   aisb-probe vsock | tiocsti | ptrace | keyctl | bpf | userns | mountns | mount
//!   aisb-probe capeff            exits 0 when the effective capability set is empty
//!   aisb-probe seccomp           exits 0 when a seccomp filter is in force
//!   aisb-probe connect HOST PORT
//!   aisb-probe resolve NAME      exits 0 when NAME resolves (getaddrinfo)
//!   aisb-probe http-get NAME PORT PATH   exits 0 on a 200, no proxy used
//!   aisb-probe io-uring | pidfd-getfd | x32 | foreign-abi | … (`aisb::init::probe`: these also
//!                                print their outcome, e.g. `refused: ENOSYS`)

use std::process::exit;

fn ok(r: bool) -> ! {
    exit(if r { 0 } else { 1 })
}

fn status_field(name: &str) -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim_start_matches(':').trim().to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(what) = args.first() else {
        eprintln!("usage: aisb-probe PROBE (see the source for the list)");
        exit(127)
    };
    if let Some(outcome) = aisb::init::probe::attempt(what) {
        println!("{outcome}");
        exit(outcome.exit_code())
    }
    // SAFETY (all blocks below): plain system calls with valid arguments; results checked.
    match what.as_str() {
        "vsock" => ok(unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) } >= 0),
        "tiocsti" => {
            let mut master = 0;
            let mut slave = 0;
            let r = unsafe {
                libc::openpty(
                    &mut master,
                    &mut slave,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
            if r != 0 {
                exit(127) // no terminal to try it on: the attempt could not run
            }
            let c: u8 = b'x';
            ok(unsafe { libc::ioctl(slave, libc::TIOCSTI, &c) } == 0)
        }
        // PTRACE_ATTACH to our parent (outside the probe, inside the sandbox).
        "ptrace" => ok(unsafe {
            libc::ptrace(
                libc::PTRACE_ATTACH,
                libc::getppid(),
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::c_void>(),
            )
        } == 0),
        // KEYCTL_GET_KEYRING_ID of the session keyring.
        "keyctl" => ok(unsafe { libc::syscall(libc::SYS_keyctl, 0, -3i64, 1) } >= 0),
        "bpf" => {
            // BPF_PROG_LOAD with an empty program: EPERM (seccomp) vs EINVAL (reached bpf).
            let r = unsafe { libc::syscall(libc::SYS_bpf, 5, std::ptr::null::<u8>(), 0) };
            let e = std::io::Error::last_os_error().raw_os_error();
            ok(r >= 0 || e == Some(libc::EINVAL) || e == Some(libc::EFAULT))
        }
        "userns" => ok(unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0),
        "mountns" => ok(unsafe { libc::unshare(libc::CLONE_NEWNS) } == 0),
        "mount" => {
            let t = c"tmpfs";
            let target = c"/tmp";
            ok(
                unsafe {
                    libc::mount(t.as_ptr(), target.as_ptr(), t.as_ptr(), 0, std::ptr::null())
                } == 0,
            )
        }
        "capeff" => ok(status_field("CapEff").is_some_and(|v| v.chars().all(|c| c == '0'))),
        "seccomp" => ok(status_field("Seccomp").as_deref() == Some("2")),
        "connect" => {
            let (Some(host), Some(port)) = (args.get(1), args.get(2)) else {
                exit(127)
            };
            let Ok(port) = port.parse::<u16>() else {
                exit(127)
            };
            ok(std::net::TcpStream::connect_timeout(
                &match format!("{host}:{port}").parse() {
                    Ok(a) => a,
                    Err(_) => exit(127),
                },
                std::time::Duration::from_secs(3),
            )
            .is_ok())
        }
        // Transparent egress: a name looked up like any program does (getaddrinfo), and a
        // plain HTTP GET to NAME:PORT that ignores every proxy variable: 0 on a 200.
        "resolve" => {
            let Some(name) = args.get(1) else { exit(127) };
            ok(
                std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), 80))
                    .is_ok_and(|mut a| a.next().is_some()),
            )
        }
        "http-get" => {
            use std::io::{Read, Write};
            let (Some(host), Some(port), Some(path)) = (args.get(1), args.get(2), args.get(3))
            else {
                exit(127)
            };
            let Ok(port) = port.parse::<u16>() else {
                exit(127)
            };
            let Ok(mut s) = std::net::TcpStream::connect((host.as_str(), port)) else {
                exit(1)
            };
            let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
            let req = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
            let mut answer = Vec::new();
            let _ = s.write_all(req.as_bytes());
            let _ = s.take(1 << 20).read_to_end(&mut answer);
            ok(answer.starts_with(b"HTTP/1.0 200") || answer.starts_with(b"HTTP/1.1 200"))
        }
        _ => {
            eprintln!("aisb-probe: unknown probe `{what}`");
            exit(127)
        }
    }
}
