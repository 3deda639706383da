//! The build's progress on stderr: a spinner on the step being built (on a terminal), every
//! line a step prints, and one line per node with its outcome and time.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::graph::{Node, Outcome, Progress};

pub struct Bar {
    pb: ProgressBar,
    total: usize,
    tty: bool,
    /// Also show the nodes that make no layer (ARG, ENV, …).
    verbose: bool,
    /// The node being built, said before its first line of output (so a log read without the
    /// spinner shows which step printed it).
    current: Option<String>,
}

impl Bar {
    pub fn new(total: usize, verbose: bool) -> Bar {
        let tty = std::io::stderr().is_terminal();
        let pb = if tty {
            ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        pb.set_style(
            ProgressStyle::with_template("{spinner} {elapsed:>4} {wide_msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        Bar {
            pb,
            total,
            tty,
            verbose,
            current: None,
        }
    }

    fn say(&self, line: String) {
        if self.tty {
            self.pb.println(line);
        } else {
            eprintln!("{line}");
        }
    }
}

fn short(s: &str) -> String {
    let one = s.replace('\n', " ");
    if one.chars().count() > 100 {
        format!("{}…", one.chars().take(99).collect::<String>())
    } else {
        one
    }
}

impl Progress for Bar {
    fn start(&mut self, index: usize, node: &Node) {
        self.pb.set_position(index as u64);
        // The spinner's clock is the step's own.
        self.pb.reset_elapsed();
        let label = format!("[{}/{}] {}", index + 1, self.total, short(&node.what));
        if node.entry.is_some() && !node.cached {
            self.pb.enable_steady_tick(Duration::from_millis(120));
            self.current = Some(format!("  {label}"));
        }
        self.pb.set_message(label);
    }

    fn line(&mut self, line: &str) {
        if let Some(header) = self.current.take() {
            self.say(header);
        }
        self.say(format!("    │ {line}"));
    }

    fn done(&mut self, index: usize, node: &Node, outcome: Outcome, secs: f64) {
        self.pb.disable_steady_tick();
        self.current = None;
        let what = short(&node.what);
        let n = format!("[{}/{}]", index + 1, self.total);
        match outcome {
            Outcome::Config if !self.verbose => {}
            Outcome::Config => self.say(format!("  {n} {what}")),
            Outcome::Cached => self.say(format!("  {n} {what}  (cached)")),
            Outcome::Built => self.say(format!("  {n} {what}  (built in {secs:.1} s)")),
        }
        self.pb.set_position(index as u64 + 1);
        if index + 1 == self.total {
            self.pb.finish_and_clear();
        }
    }
}
