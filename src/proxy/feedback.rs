//! What the sandbox refused during one tool call, for the agent that made it (issue 32): the
//! agent's pre-tool hook marks where the call starts ([`Feedback::begin`], by the call's id),
//! the proxy notes each refusal as it happens ([`Feedback::refused`]), and the post-tool hook
//! asks what was refused since its call began ([`Feedback::since`]). The answer goes back to
//! the model with the tool's result, so an agent learns why `curl` failed instead of retrying,
//! and can tell the user which rule to change.
//!
//! Attribution is by time only: a refusal during the call's window is the call's. When another
//! call was running at the same time (agents run tools in parallel), the answer says that the
//! refusal may be the other call's; it is never dropped. Everything here is bounded: the most
//! recent refusals and calls only, each line cut, the answer cut. The text is model input: no
//! control characters.

use std::collections::VecDeque;

/// Refusals kept (the most recent).
const MAX_REFUSALS: usize = 64;
/// Calls whose start is kept (the most recent): a call whose post-tool hook never came (the
/// agent was stopped) falls off.
const MAX_CALLS: usize = 256;
/// The most of one refusal's text.
const MAX_LINE: usize = 300;
/// The most of one answer.
const MAX_ANSWER: usize = crate::vocab::FEEDBACK_MAX;
/// A call begun longer ago than this and never asked about (its post-tool hook did not run:
/// the agent was stopped, the tool failed before it ran) no longer counts as running.
const STALE: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Debug, Default)]
pub struct Feedback {
    /// Bumped by every refusal and every call's start.
    seq: u64,
    /// (seq, text, whether more than one call was running then).
    refusals: VecDeque<(u64, String, bool)>,
    /// Calls begun and not yet asked about: (id, seq at their start, when).
    calls: VecDeque<(String, u64, std::time::Instant)>,
}

use crate::vocab::tool_call_id as call_id;

/// `text` on one line, printable, at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    out.truncate(out.trim_end().len());
    out
}

impl Feedback {
    /// The call `id` starts now.
    pub fn begin(&mut self, id: &str) {
        let Some(id) = call_id(id) else { return };
        self.seq += 1;
        self.calls.retain(|(c, ..)| *c != id);
        if self.calls.len() == MAX_CALLS {
            self.calls.pop_front();
        }
        self.calls
            .push_back((id, self.seq, std::time::Instant::now()));
    }

    /// The sandbox was refused something: `what` says what and by which rule.
    pub fn refused(&mut self, what: &str) {
        self.seq += 1;
        if self.refusals.len() == MAX_REFUSALS {
            self.refusals.pop_front();
        }
        let running = self
            .calls
            .iter()
            .filter(|(.., at)| at.elapsed() < STALE)
            .count();
        self.refusals
            .push_back((self.seq, one_line(what, MAX_LINE), running > 1));
    }

    /// The call `id` ended without a result to hear about (the agent's own permission layer
    /// refused it after the pre-tool hook let it through).
    pub fn end(&mut self, id: &str) {
        if let Some(id) = call_id(id) {
            self.calls.retain(|(c, ..)| *c != id);
        }
    }

    /// What was refused since the call `id` began, as text for the model (empty: nothing, or
    /// a call this proxy never saw begin). The call is over: it is forgotten.
    pub fn since(&mut self, id: &str) -> String {
        let Some(id) = call_id(id) else {
            return String::new();
        };
        let Some(i) = self.calls.iter().position(|(c, ..)| *c == id) else {
            return String::new();
        };
        let (_, start, _) = self.calls.remove(i).expect("found above");
        let mine: Vec<&(u64, String, bool)> = self
            .refusals
            .iter()
            .filter(|(seq, ..)| *seq > start)
            .collect();
        if mine.is_empty() {
            return String::new();
        }
        let lines: Vec<&str> = mine.iter().map(|(_, l, _)| l.as_str()).collect();
        // Another call was running when one of these was refused: its refusals and this
        // one's are told apart by time alone.
        let overlapped = mine.iter().any(|(.., o)| *o);
        let mut out = String::from(
            "[aisb] The sandbox refused this during the tool call (the command saw the failure; retrying will not help; the names are the ones asked for inside):\n",
        );
        for l in lines {
            out.push_str("- ");
            out.push_str(l);
            out.push('\n');
        }
        if overlapped {
            out.push_str(
                "(Another tool call ran at the same time: some of these may be its refusals.)\n",
            );
        }
        out.push_str(
            "To allow one, the user changes sandbox.kdl outside the sandbox (`aisb why TARGET` says which rule decides); you cannot change it from here.",
        );
        if out.len() > MAX_ANSWER {
            let mut cut = MAX_ANSWER;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_hears_what_was_refused_during_it_and_only_that() {
        let mut f = Feedback::default();
        f.refused("before any call");
        f.begin("toolu_1");
        f.refused("blocked CONNECT evil.test:443: not in the allowlist");
        let text = f.since("toolu_1");
        assert!(text.starts_with("[aisb] The sandbox refused"), "{text}");
        assert!(text.contains("evil.test:443"), "{text}");
        assert!(!text.contains("before any call"), "{text}");
        assert!(!text.contains("Another tool call"), "{text}");
        // Asked once: the call is over.
        assert_eq!(f.since("toolu_1"), "");
        // A call with nothing refused, and one never begun, hear nothing.
        f.begin("toolu_2");
        assert_eq!(f.since("toolu_2"), "");
        assert_eq!(f.since("toolu_never"), "");
    }

    #[test]
    fn overlapping_calls_are_told_the_refusal_may_be_the_others() {
        let mut f = Feedback::default();
        f.begin("a");
        f.begin("b");
        f.refused("blocked x:443");
        let a = f.since("a");
        assert!(
            a.contains("x:443") && a.contains("Another tool call"),
            "{a}"
        );
        // b heard of it too (never dropped), and that it may be a's.
        let b = f.since("b");
        assert!(
            b.contains("x:443") && b.contains("Another tool call"),
            "{b}"
        );
        // Alone again: no such warning.
        f.begin("c");
        f.refused("blocked y:443");
        let c = f.since("c");
        assert!(
            c.contains("y:443") && !c.contains("Another tool call"),
            "{c}"
        );
        // A call the agent's own layer refused after the hook ends without a result, and
        // makes no later answer uncertain.
        f.begin("denied");
        f.end("denied");
        f.begin("d");
        f.refused("blocked z:443");
        assert!(!f.since("d").contains("Another tool call"));
    }

    #[test]
    fn everything_is_bounded_and_printable() {
        let mut f = Feedback::default();
        for i in 0..10_000 {
            f.begin(&format!("call{i}"));
            f.refused(&format!("line {i}\u{1b}[31m\r\n{}", "x".repeat(10_000)));
        }
        assert!(f.calls.len() <= MAX_CALLS && f.refusals.len() <= MAX_REFUSALS);
        assert!(f
            .refusals
            .iter()
            .all(|(_, l, _)| l.chars().count() <= MAX_LINE));
        f.begin("last");
        for _ in 0..100 {
            f.refused(&"y".repeat(1000));
        }
        let text = f.since("last");
        assert!(text.len() <= MAX_ANSWER, "{}", text.len());
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'));
        assert_eq!(call_id("\u{1b}]52;;x\u{7}"), Some("52x".into()));
        assert_eq!(call_id("\n\t"), None);
    }
}
