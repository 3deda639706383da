//! A host command aisb waits for, bounded in time and in what it prints: a credential
//! provider (`from command=`), aisb's git in a clone a sandbox shaped. Whatever the command
//! does — hangs, prints without end, leaves a process behind that holds its output open — the
//! caller gets an answer within the limit, and the command's whole process group is gone.
//! Imports nothing of aisb.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a command may run and how much of each stream is kept.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// From the spawn to the end of its output.
    pub time: Duration,
    /// Bytes kept of stdout (and of stderr when captured); the rest is read and dropped, so
    /// that the command is never blocked on a full pipe. A caller that must know whether
    /// output was dropped asks for one byte more than it accepts.
    pub output: u64,
}

impl Bounds {
    /// Whether `kept` (a stream as [`output_within`] returns it) reached the cap: the command
    /// printed at least that much, perhaps more, and what is kept may be cut.
    pub fn reached(&self, kept: &[u8]) -> bool {
        kept.len() as u64 >= self.output
    }
}

/// `cmd` run to its end in a process group of its own, stdout piped (and stderr when
/// `capture_stderr`; otherwise it stays as the caller set it). stdin is the caller's to set:
/// left alone, the command shares aisb's. Past `bounds.time` the group is killed and the answer
/// is a `TimedOut` error; when the command ends, what it left running in its group is killed
/// too.
pub fn output_within(
    cmd: Command,
    bounds: Bounds,
    capture_stderr: bool,
) -> std::io::Result<Output> {
    run(cmd, None, bounds, capture_stderr)
}

/// [`output_within`] with `input` on the command's stdin, written from a thread of its own (a
/// command that writes while it reads never blocks on a full pipe, and a command that stops
/// reading holds nothing: the thread is not waited for).
pub fn output_within_input(
    cmd: Command,
    input: Vec<u8>,
    bounds: Bounds,
    capture_stderr: bool,
) -> std::io::Result<Output> {
    run(cmd, Some(input), bounds, capture_stderr)
}

fn run(
    mut cmd: Command,
    input: Option<Vec<u8>>,
    bounds: Bounds,
    capture_stderr: bool,
) -> std::io::Result<Output> {
    cmd.process_group(0).stdout(Stdio::piped());
    if capture_stderr {
        cmd.stderr(Stdio::piped());
    }
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    // If aisb dies (the thread that waits for it, with it), the command goes too: nothing of
    // it runs on unbounded.
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            Ok(())
        });
    }
    let start = Instant::now();
    let mut child = cmd.spawn()?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        std::thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut stdin, &input);
        });
    }
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let kill_group = || {
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    };
    let (tx, rx) = mpsc::channel::<(bool, Vec<u8>)>();
    let mut readers = 0;
    let streams: [(bool, Option<Box<dyn Read + Send>>); 2] = [
        (
            true,
            child
                .stdout
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        ),
        (
            false,
            child
                .stderr
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        ),
    ];
    for (is_out, stream) in streams {
        let Some(mut r) = stream else { continue };
        let tx = tx.clone();
        readers += 1;
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut r).take(bounds.output).read_to_end(&mut kept);
            let _ = std::io::copy(&mut r, &mut std::io::sink());
            let _ = tx.send((is_out, kept));
        });
    }
    drop(tx);
    let timed_out = || {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("it did not end within {} s", bounds.time.as_secs()),
        )
    };
    // Short naps at first (most of these commands take milliseconds), at most 50 ms.
    let mut nap = Duration::from_micros(200);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > bounds.time {
            kill_group();
            let _ = child.wait();
            return Err(timed_out());
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(50));
    };
    // What it left running in its group would hold the output open.
    kill_group();
    let mut out = Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    for _ in 0..readers {
        // A process that left the group (setsid) may still hold a pipe: not waited for past
        // the limit.
        let left = bounds
            .time
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(100));
        match rx.recv_timeout(left) {
            Ok((true, b)) => out.stdout = b,
            Ok((false, b)) => out.stderr = b,
            Err(_) => return Err(timed_out()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(script).stdin(Stdio::null());
        c
    }

    const B: Bounds = Bounds {
        time: Duration::from_secs(5),
        output: 16,
    };

    #[test]
    fn output_and_status_come_back() {
        let o = output_within(sh("echo out; echo err >&2; exit 3"), B, true).unwrap();
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr, b"err\n");
        assert_eq!(o.status.code(), Some(3));
    }

    #[test]
    fn endless_output_is_cut_and_does_not_block_the_command() {
        let o = output_within(sh("yes | head -c 1000000; echo done >&2"), B, true).unwrap();
        assert_eq!(o.stdout.len(), 16);
        assert_eq!(o.stderr, b"done\n");
        assert!(o.status.success());
    }

    #[test]
    fn input_is_fed_while_output_is_read() {
        // 4 MiB through `cat`: more than a pipe holds either way.
        let input = vec![b'x'; 4 << 20];
        let b = Bounds {
            output: 8 << 20,
            ..B
        };
        let o = output_within_input(sh("cat"), input.clone(), b, true).unwrap();
        assert_eq!(o.stdout, input);
        // A command that never reads its input and prints past the cap still ends.
        let o = output_within_input(sh("yes | head -c 3000000"), input, B, true).unwrap();
        assert_eq!(o.stdout.len(), 16);
    }

    #[test]
    fn a_hang_is_killed_with_its_group_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("pid");
        let script = format!("sleep 60 & echo $! > {}; wait", mark.display());
        let b = Bounds {
            time: Duration::from_millis(500),
            ..B
        };
        let t = Instant::now();
        let e = output_within(sh(&script), b, true).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let pid: i32 = std::fs::read_to_string(&mark)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Killed (SIGKILL lands asynchronously), perhaps not yet reaped: gone or a zombie
        // within a second.
        let dead = || {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            state.is_empty() || state.contains(") Z")
        };
        let t = Instant::now();
        while !dead() && t.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(dead(), "the group's sleep still runs");
    }

    #[test]
    fn a_process_left_behind_outside_the_group_does_not_hold_the_caller() {
        // setsid: out of the group, still holding stdout.
        let b = Bounds {
            time: Duration::from_millis(800),
            ..B
        };
        let t = Instant::now();
        // The shell waits until setsid has surely left the group.
        let r = output_within(sh("setsid sleep 10 & sleep 0.3; echo started"), b, true);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    }
}
