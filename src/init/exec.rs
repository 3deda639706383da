//! Starting a program from a forked child, with everything it needs prepared before the fork.
//!
//! Between `fork` and `exec` the child of a multi-threaded process (the init runs relay
//! threads) may call only async-signal-safe functions: another thread may have held the
//! allocator's lock, or any other, at the instant of the fork, and in the child nobody will
//! ever release it. `nix::unistd::execvp` builds its pointer array on the heap and searches
//! PATH there. So [`Exec::prepare`] does all of that in the parent, and [`Exec::run`], in the
//! child, calls only `execve`, `write` and `_exit` on memory prepared before.
//!
//! The program is found as glibc's `execvp(3)` finds it: a name with a `/` is run as it is;
//! otherwise each directory of the environment's `PATH` is tried in order (`/bin:/usr/bin`
//! when there is none; an empty entry is the working directory). A candidate that does not
//! exist (ENOENT, ENOTDIR, ESTALE, ENODEV, ETIMEDOUT) or may not be run (EACCES, reported at
//! the end when nothing else ran) is passed over; any other error stops the search. A file the
//! kernel does not recognise as a program (ENOEXEC) is run by `/bin/sh` as a script.

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;

use libc::c_char;
use nix::errno::Errno;

/// `execvp`'s search path when the environment has no `PATH` (glibc's `_CS_PATH`).
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";
/// The shell that runs a script without `#!` (glibc's `_PATH_BSHELL`).
const SHELL: &CStr = c"/bin/sh";

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("no command to run")]
    NoCommand,
    #[error("an argument or environment variable contains a NUL byte")]
    Nul,
}

/// A program to start, found and laid out before the fork. The pointer arrays point into the
/// `CString`s held beside them, whose heap buffers never move while this value lives.
pub struct Exec {
    program: CString,
    candidates: Vec<Candidate>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    _args: Vec<CString>,
    _env: Vec<CString>,
}

struct Candidate {
    path: CString,
    /// `/bin/sh PATH ARGS...`, for when the kernel says the file is not a program.
    script_argv: Vec<*const c_char>,
}

fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

impl Exec {
    /// `command[0]` with arguments `command[1..]` (argv[0] is `command[0]` as given), under
    /// environment `env` (`NAME=value` entries), whose `PATH` is the one searched.
    pub fn prepare(
        command: &[impl AsRef<OsStr>],
        env: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<Exec, ExecError> {
        let args = command
            .iter()
            .map(|a| CString::new(a.as_ref().as_bytes()).map_err(|_| ExecError::Nul))
            .collect::<Result<Vec<_>, _>>()?;
        let env = env
            .into_iter()
            .map(|v| CString::new(v).map_err(|_| ExecError::Nul))
            .collect::<Result<Vec<_>, _>>()?;
        let program = args.first().ok_or(ExecError::NoCommand)?.clone();
        let path = env
            .iter()
            .find_map(|v| v.as_bytes().strip_prefix(b"PATH="))
            .unwrap_or(DEFAULT_PATH);
        let candidates = candidates(program.as_bytes(), path)
            .into_iter()
            .map(|path| {
                let script_argv = [SHELL.as_ptr(), path.as_ptr()]
                    .into_iter()
                    .chain(args[1..].iter().map(|a| a.as_ptr()))
                    .chain(std::iter::once(std::ptr::null()))
                    .collect();
                Candidate { path, script_argv }
            })
            .collect();
        Ok(Exec {
            program,
            candidates,
            argv: null_terminated(&args),
            envp: null_terminated(&env),
            _args: args,
            _env: env,
        })
    }

    /// This process's own environment, as [`Exec::prepare`] takes it.
    pub fn own_environment() -> impl Iterator<Item = Vec<u8>> {
        std::env::vars_os().map(|(k, v)| {
            let mut e = k.as_bytes().to_vec();
            e.push(b'=');
            e.extend_from_slice(v.as_bytes());
            e
        })
    }

    /// Start the program in place of this process; if no candidate can be run, say why on
    /// stderr and exit 127 (not found) or 126 (found, not runnable), as shells do.
    ///
    /// Async-signal-safe: `execve`, reading `errno`, `write` and `_exit` only, on memory
    /// prepared before the fork; nothing allocates, locks or unwinds.
    pub fn run(&self) -> ! {
        let mut denied = false;
        let error = 'search: {
            let mut error = Errno::ENOENT;
            for c in &self.candidates {
                // SAFETY: every pointer refers to a NUL-terminated string or a NULL-terminated
                // array of them, owned by `self`, alive and unchanged for the whole call.
                unsafe { libc::execve(c.path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
                error = Errno::last();
                if error == Errno::ENOEXEC {
                    // SAFETY: as above.
                    unsafe {
                        libc::execve(SHELL.as_ptr(), c.script_argv.as_ptr(), self.envp.as_ptr())
                    };
                    error = Errno::last();
                }
                match error {
                    Errno::EACCES => denied = true,
                    Errno::ENOENT
                    | Errno::ENOTDIR
                    | Errno::ESTALE
                    | Errno::ENODEV
                    | Errno::ETIMEDOUT => {}
                    _ => break 'search error,
                }
            }
            if denied {
                Errno::EACCES
            } else {
                error
            }
        };
        let why: &[u8] = match error {
            Errno::ENOENT => b"`: not found\n",
            Errno::EACCES => b"`: permission denied\n",
            _ => b"`: not executable\n",
        };
        for part in [
            b"aisb: cannot run `".as_slice(),
            self.program.as_bytes(),
            why,
        ] {
            // SAFETY: write(2) of a live buffer with its length; a short or failed write of a
            // message is of no consequence.
            let _ = unsafe { libc::write(libc::STDERR_FILENO, part.as_ptr().cast(), part.len()) };
        }
        // SAFETY: _exit ends the child at once: no destructor, no atexit handler, no flush of
        // buffers that belong to the parent.
        unsafe { libc::_exit(if error == Errno::ENOENT { 127 } else { 126 }) }
    }
}

/// The paths `execvp` tries for `program` along `path`, in order.
fn candidates(program: &[u8], path: &[u8]) -> Vec<CString> {
    if program.is_empty() {
        return Vec::new();
    }
    if program.contains(&b'/') {
        return CString::new(program).into_iter().collect();
    }
    path.split(|b| *b == b':')
        .filter_map(|dir| {
            let mut p = dir.to_vec();
            if !p.is_empty() && !p.ends_with(b"/") {
                p.push(b'/');
            }
            p.extend_from_slice(program);
            CString::new(p).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: Vec<CString>) -> Vec<String> {
        v.into_iter().map(|c| c.into_string().unwrap()).collect()
    }

    #[test]
    fn candidates_follow_execvp() {
        assert_eq!(
            strings(candidates(b"ls", b"/usr/local/bin:/usr/bin/:/bin")),
            ["/usr/local/bin/ls", "/usr/bin/ls", "/bin/ls"]
        );
        // An empty entry is the working directory.
        assert_eq!(strings(candidates(b"x", b":/bin:")), ["x", "/bin/x", "x"]);
        // A name with a slash is not searched for.
        assert_eq!(strings(candidates(b"./x", b"/bin")), ["./x"]);
        assert_eq!(strings(candidates(b"a/x", b"/bin")), ["a/x"]);
        assert!(candidates(b"", b"/bin").is_empty());
    }

    #[test]
    fn prepare_searches_the_given_environment() {
        let e = Exec::prepare(&["sh", "-c", "true"], [b"PATH=/opt/x:/bin".to_vec()]).unwrap();
        assert_eq!(
            e.candidates
                .iter()
                .map(|c| c.path.to_str().unwrap())
                .collect::<Vec<_>>(),
            ["/opt/x/sh", "/bin/sh"]
        );
        assert_eq!(e.argv.len(), 4);
        assert!(e.argv[3].is_null() && e.envp[1].is_null());
        // The script form: /bin/sh, the candidate, then the arguments after argv[0].
        // SAFETY: pointers into `e`'s own strings.
        let script: Vec<&str> = e.candidates[0].script_argv[..4]
            .iter()
            .map(|p| unsafe { CStr::from_ptr(*p) }.to_str().unwrap())
            .collect();
        assert_eq!(script, ["/bin/sh", "/opt/x/sh", "-c", "true"]);
        assert!(e.candidates[0].script_argv[4].is_null());
        let d = Exec::prepare(&["sh"], std::iter::empty()).unwrap();
        assert_eq!(d.candidates.len(), 2, "the default PATH is /bin:/usr/bin");
        assert!(matches!(
            Exec::prepare(&["a\0b"], std::iter::empty()),
            Err(ExecError::Nul)
        ));
        assert!(matches!(
            Exec::prepare(&[] as &[&str], std::iter::empty()),
            Err(ExecError::NoCommand)
        ));
    }
}
