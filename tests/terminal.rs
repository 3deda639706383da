//! A named sandbox's sessions get a terminal like the unnamed `aisb up`: inside, `tty` names a
//! pseudo-terminal that exists there (the sandbox's own devpts), and a resize of the window
//! reaches it. Tested in real tmux windows, for `aisb up NAME` (which starts the sandbox) and
//! `aisb exec NAME` (which joins it), on both backends, as root and as an ordinary user.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmux server of the test's own (its own socket directory), run as `user` when given.
struct Tmux {
    dir: PathBuf,
    user: Option<(u32, u32)>,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        let mut c = Command::new("tmux");
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(&mut c, uid);
            std::os::unix::process::CommandExt::gid(&mut c, gid);
        }
        c.args(["-L", "aisb-test"])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("TMUX_TMPDIR", &self.dir)
            // tmux runs window commands with $SHELL, else the account's (nologin).
            .env("SHELL", "/bin/sh")
            .env("TERM", "xterm")
            .output()
            .unwrap()
    }
    fn send(&self, window: &str, keys: &str) {
        let o = self.cmd(&["send-keys", "-t", window, keys, "Enter"]);
        assert!(o.status.success(), "send-keys: {:?}", o);
    }
    fn screen(&self, window: &str) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", window]).stdout)
            .into_owned()
    }
    /// Types `keys` into `window` again (every 500 ms, at most 60 s) until it shows `text`:
    /// for a line typed while a program that swallows typeahead (Neovim quitting) or a ^C
    /// that discards the shell's pending line may still be in the way. Returns the screen.
    fn retype_until(&self, window: &str, keys: &str, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.send(window, keys);
            std::thread::sleep(Duration::from_millis(500));
            let s = self.screen(window);
            if s.contains(text) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "window {window} never showed `{text}` after `{keys}`:\n{s}"
            );
        }
    }
    /// Waits (at most 60 s) until `window` shows `text`; returns the screen.
    fn wait_for(&self, window: &str, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.screen(window);
            if s.contains(text) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "window {window} never showed `{text}`:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// Resize `window` to `cols`x`rows` and wait until the shell in it reports that size
/// (retyped until it does, at most 60 s: tmux applies a resize asynchronously).
fn follows_resize(tmux: &Tmux, window: &str, who: &str, cols: u16, rows: u16) {
    let o = tmux.cmd(&[
        "resize-window",
        "-t",
        window,
        "-x",
        &cols.to_string(),
        "-y",
        &rows.to_string(),
    ]);
    assert!(o.status.success(), "{who} resize-window: {o:?}");
    tmux.retype_until(
        window,
        "echo \"RESIZED $(stty size)\"",
        &format!("RESIZED {rows} {cols}"),
    );
}

/// A test's scratch: a git repository with one commit (`repo`), a home, and a tmux server of
/// its own run as `user`; `exe` is aisb as `user` may run it.
struct Scratch {
    t: tempfile::TempDir,
    repo: PathBuf,
    exe: PathBuf,
    tmux: Tmux,
    who: String,
}

fn scratch(backend: &str, user: Option<(u32, u32)>) -> Scratch {
    let who = format!(
        "[{backend}, {}]",
        user.map_or("root".into(), |u| format!("uid {}", u.0))
    );
    let t = tempfile::tempdir().unwrap();
    let repo = t.path().join("repo");
    for d in ["repo", "home", "tmux"] {
        std::fs::create_dir_all(t.path().join(d)).unwrap();
    }
    std::fs::write(repo.join("README"), "hi\n").unwrap();
    support::git_in(&repo, &["init", "-q", "-b", "main"]);
    support::git_in(&repo, &["add", "README"]);
    support::git_in(
        &repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "one",
        ],
    );
    let exe = match user {
        Some((uid, gid)) => support::hand_to_user(t.path(), uid, gid),
        None => PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
    };
    std::fs::set_permissions(
        t.path().join("tmux"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let tmux = Tmux {
        dir: t.path().join("tmux"),
        user,
    };
    Scratch {
        t,
        repo,
        exe,
        tmux,
        who,
    }
}

fn session_terminals(backend: &str, user: Option<(u32, u32)>) {
    let Scratch {
        t,
        repo,
        exe,
        tmux,
        who,
    } = scratch(backend, user);
    let env = |p: &Path| {
        format!(
            "cd {} && env -i PATH=/usr/bin:/bin HOME={} XDG_CACHE_HOME={} TERM=xterm SHELL=/bin/sh",
            repo.display(),
            p.join("home").display(),
            p.join("cache").display()
        )
    };
    let up = format!(
        "{} {} up --backend {backend} term -- /bin/sh; echo SESSION-ENDED; sleep 60",
        env(t.path()),
        exe.display()
    );
    let o = tmux.cmd(&[
        "new-session",
        "-d",
        "-x",
        "120",
        "-y",
        "30",
        "-n",
        "up",
        &up,
    ]);
    assert!(o.status.success(), "{who} tmux new-session: {o:?}");
    // The shell answers (what is typed before it starts waits in the terminal): it is up.
    tmux.send("up", "echo UP-$((6*7))");
    tmux.wait_for("up", "UP-42");
    let exec = format!(
        "{} {} exec term -- /bin/sh; echo SESSION-ENDED; sleep 60",
        env(t.path()),
        exe.display()
    );
    let o = tmux.cmd(&["new-window", "-d", "-n", "exec", &exec]);
    assert!(o.status.success(), "{who} tmux new-window: {o:?}");
    tmux.send("exec", "echo EXEC-$((6*7))");
    tmux.wait_for("exec", "EXEC-42");
    for (window, (cols, rows)) in [("up", (100, 25)), ("exec", (90, 20))] {
        // `tty` names a terminal that exists inside, and it is the one stdin is.
        tmux.send(
            window,
            "t=$(tty) && test -c \"$t\" && [ \"$t\" -ef /dev/stdin ] && echo \"TTY-OK $t\"",
        );
        let s = tmux.wait_for(window, "TTY-OK /dev/pts/");
        assert!(!s.contains("not a tty"), "{who} {window}:\n{s}");
        tmux.send(window, "echo \"SIZE $(stty size)\"");
        tmux.wait_for(window, "SIZE 30 120");
        follows_resize(&tmux, window, &who, cols, rows);
    }
    // A session without a terminal of its own is in a session of its own too: /dev/tty there
    // is not the caller's terminal.
    let notty = format!(
        "{} {} exec term -- sh -c '(echo x > /dev/tty) 2>/dev/null && echo TTY-OPENED || echo TTY-REFUSED' < /dev/null; echo NOTTY-DONE; sleep 60",
        env(t.path()),
        exe.display()
    );
    let o = tmux.cmd(&["new-window", "-d", "-n", "notty", &notty]);
    assert!(o.status.success(), "{who} tmux new-window: {o:?}");
    let s = tmux.wait_for("notty", "NOTTY-DONE");
    assert!(
        s.contains("TTY-REFUSED") && !s.contains("TTY-OPENED"),
        "{who} /dev/tty in a session without a terminal:\n{s}"
    );
    tmux.send("exec", "exit");
    tmux.wait_for("exec", "SESSION-ENDED");
    tmux.send("up", "exit");
    tmux.wait_for("up", "SESSION-ENDED");
}

#[test]
fn named_sessions_have_the_sandboxs_own_terminal_and_follow_resizes() {
    if !support::root_or_skip("the terminal test (root and an ordinary user)") {
        return;
    }
    if !support::tool_or_skip("tmux", "the terminal test") {
        return;
    }
    let user = support::test_user();
    for backend in ["bwrap", "libcontainer"] {
        for caller in [None, Some(user)] {
            session_terminals(backend, caller);
        }
    }
}

/// `aisb run` and `aisb exec` with their output on the caller's terminal but their input
/// elsewhere (`< /dev/null`, a pipe): the workload still sees a terminal, and cannot read what
/// the user types into it (the terminal a shell passes on is open for reading on 1 and 2 too).
#[test]
fn output_on_the_callers_terminal_cannot_be_read_from() {
    if !support::root_or_skip("the terminal test") {
        return;
    }
    if !support::tool_or_skip("script", "the terminal test") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    for d in ["repo", "home"] {
        std::fs::create_dir_all(t.path().join(d)).unwrap();
    }
    support::git_in(&t.path().join("repo"), &["init", "-q"]);
    let aisb = env!("CARGO_BIN_EXE_aisb");
    let probe = "test -t 1 && echo OUT-IS-A-TERMINAL; for fd in 1 2; do timeout 5 head -c1 <&$fd >/dev/null 2>&1; echo READ-$fd-RC=$?; done";
    for backend in ["bwrap", "libcontainer"] {
        // `script` gives the command a terminal on 0-2; the command's own input is /dev/null.
        let inner = format!("{aisb} run --backend {backend} -- sh -c '{probe}' < /dev/null");
        let o = std::process::Command::new("script")
            .args(["-qec", &inner, "/dev/null"])
            .current_dir(t.path().join("repo"))
            .env("HOME", t.path().join("home"))
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).replace('\r', "");
        assert!(out.contains("OUT-IS-A-TERMINAL"), "[{backend}] {out}");
        for fd in [1, 2] {
            // head's read fails at once (EBADF: write-only), rather than waiting 5 s and
            // timing out (124) or reading a byte the user typed (0).
            assert!(
                out.contains(&format!("READ-{fd}-RC=1")),
                "[{backend}] fd {fd} of the caller's terminal is readable inside:\n{out}"
            );
        }
    }
}

/// What the sandbox prints cannot act on the caller's terminal (issue 29, item 7): an OSC 52
/// that writes the clipboard, printed by `aisb run` (the terminal on 0-2) and by an `aisb up`
/// shell, never reaches tmux's clipboard (set-clipboard on stores it as a paste buffer, which
/// the same sequence printed outside aisb is shown to do first), while a full-screen program
/// (Neovim) still draws and ^C still interrupts. Both backends, as root and as a user.
#[test]
fn what_the_sandbox_prints_cannot_act_on_the_terminal() {
    if !support::root_or_skip("the terminal test (root and an ordinary user)") {
        return;
    }
    for tool in ["tmux", "nvim"] {
        if !support::tool_or_skip(tool, "the terminal test") {
            return;
        }
    }
    let user = support::test_user();
    for backend in ["bwrap", "libcontainer"] {
        for caller in [None, Some(user)] {
            escapes_filtered(backend, caller);
        }
    }
}

fn escapes_filtered(backend: &str, user: Option<(u32, u32)>) {
    let Scratch {
        t,
        repo,
        exe,
        tmux,
        who,
    } = scratch(backend, user);
    let env = format!(
        "cd {} && env -i PATH=/usr/bin:/bin HOME={} XDG_CACHE_HOME={} TERM=xterm SHELL=/bin/sh",
        repo.display(),
        t.path().join("home").display(),
        t.path().join("cache").display()
    );
    let buffers = || String::from_utf8_lossy(&tmux.cmd(&["list-buffers"]).stdout).into_owned();
    // The sequence, as the shell's printf writes it: ESC ] 52 ; c ; base64 BEL.
    let osc52 = |text: &str| {
        let b64 = match text {
            "OUTSIDE" => "T1VUU0lERQ==",
            "FROM-RUN" => "RlJPTS1SVU4=",
            _ => "RlJPTS1VUA==", // FROM-UP
        };
        format!("printf '\\033]52;c;{b64}\\007'")
    };
    let o = tmux.cmd(&[
        "new-session",
        "-d",
        "-x",
        "120",
        "-y",
        "30",
        "-n",
        "base",
        "sh",
    ]);
    assert!(o.status.success(), "{who} tmux new-session: {o:?}");
    let o = tmux.cmd(&["set-option", "-s", "set-clipboard", "on"]);
    assert!(o.status.success(), "{who} set-clipboard: {o:?}");
    // Outside aisb the sequence reaches the clipboard: the check below can fail.
    tmux.send("base", &format!("{}; echo BASE-$((6*7))", osc52("OUTSIDE")));
    tmux.wait_for("base", "BASE-42");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !buffers().contains("OUTSIDE") {
        assert!(
            Instant::now() < deadline,
            "{who} tmux never stored an OSC 52 printed outside aisb: {}",
            buffers()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = tmux.cmd(&["delete-buffer"]);
    // /dev/tty is never the caller's terminal (a session of the sandbox's own), and the run
    // ends as soon as the sandbox does (no wait on the terminal's relay, which would block
    // until a key is pressed: the bound is for a loaded CI host, a hang still fails it).
    let probe = "(echo x > /dev/tty) 2>/dev/null && echo TTY-OPENED || echo TTY-REFUSED";
    let run = format!(
        "{env} {aisb} run --backend {backend} -- sh -c \"{}; {probe}; echo RUN-\\$((6*7))\"; \
         s=$(date +%s%N); {vars} {aisb} run --backend {backend} -- true; echo TOOK-$(( ($(date +%s%N) - s) / 1000000 ))-MS; \
         {vars} {aisb} up --backend {backend} -- sh -c '{probe}' < /dev/null; echo UP-NOTTY-DONE; sleep 60",
        osc52("FROM-RUN").replace('"', "\\\""),
        aisb = exe.display(),
        vars = env.split_once(" && ").unwrap().1,
    );
    let o = tmux.cmd(&["new-window", "-d", "-n", "run", &run]);
    assert!(o.status.success(), "{who} tmux new-window: {o:?}");
    tmux.wait_for("run", "RUN-42");
    let s = tmux.wait_for("run", "-MS");
    let took: u64 = s
        .split("TOOK-")
        .nth(1)
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{who}:\n{s}"));
    assert!(
        took < 20_000,
        "{who} `aisb run -- true` on a terminal took {took} ms"
    );
    let s = tmux.wait_for("run", "UP-NOTTY-DONE");
    assert!(
        s.matches("TTY-REFUSED").count() == 2 && !s.contains("TTY-OPENED"),
        "{who} /dev/tty inside is the caller's terminal:\n{s}"
    );
    let up = format!(
        "{env} {} up --backend {backend} -- /bin/sh; echo SESSION-ENDED; sleep 60",
        exe.display()
    );
    let o = tmux.cmd(&["new-window", "-d", "-n", "up", &up]);
    assert!(o.status.success(), "{who} tmux new-window: {o:?}");
    tmux.send("up", "echo UP-$((6*7))");
    tmux.wait_for("up", "UP-42");
    follows_resize(&tmux, "up", &who, 100, 25);
    tmux.send(
        "up",
        &format!("{}; echo PRINTED-$((6*7))", osc52("FROM-UP")),
    );
    tmux.wait_for("up", "PRINTED-42");
    // A full-screen program draws: Neovim's first line and its empty-line markers.
    tmux.send(
        "up",
        "nvim -u NONE -i NONE -n -c 'call setline(1, \"DRAWN-\" . (6*7))'",
    );
    let s = tmux.wait_for("up", "DRAWN-42");
    assert!(s.lines().any(|l| l.starts_with('~')), "{who} nvim:\n{s}");
    tmux.send("up", ":q!");
    // Back at the shell (what is typed while Neovim quits is its typeahead, dropped).
    tmux.retype_until("up", "echo BACK-$((6*7))", "BACK-42");
    // ^C interrupts the foreground program (a sleep that would outlast the wait): the sleep
    // is seen running (its marker printed, no prompt after it) before the ^C.
    tmux.send("up", "clear; echo SLEEPING-$((6*7)); sleep 300; echo SLEPT");
    tmux.wait_for("up", "SLEEPING-42");
    std::thread::sleep(Duration::from_millis(300));
    let o = tmux.cmd(&["send-keys", "-t", "up", "C-c"]);
    assert!(o.status.success(), "{who} send-keys C-c: {o:?}");
    // Retyped: the shell may drop a line typed while it handles the interrupt.
    let s = tmux.retype_until("up", "echo INTERRUPTED-$((6*7))", "INTERRUPTED-42");
    assert!(!s.contains("SLEPT"), "{who}:\n{s}");
    tmux.send("up", "exit");
    tmux.wait_for("up", "SESSION-ENDED");
    let b = buffers();
    assert!(
        !b.contains("FROM-RUN") && !b.contains("FROM-UP") && b.trim().is_empty(),
        "{who} the sandbox wrote the terminal's clipboard: {b}"
    );
}
