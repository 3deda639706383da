//! A stack overflow as a crash that libFuzzer saves. Without a sanitizer nothing reports one:
//! Rust installs its guard-page handler only from its own `main` (libFuzzer's C++ `main` runs
//! here), and libFuzzer's SIGSEGV handler runs on the stack that just overflowed, so the
//! process dies without writing the input. This handler runs on a stack of its own and turns
//! the fault into an abort, which libFuzzer's SIGABRT handler (still on that stack) reports
//! with the input. Run with `-handle_segv=0` so libFuzzer keeps this handler.

use std::sync::Once;

extern "C" fn abort_on_fault(_: libc::c_int) {
    const MSG: &[u8] =
        b"\nSIGSEGV (a stack overflow, most likely): aborting so the input is saved\n";
    // SAFETY: write(2) and abort(3) are async-signal-safe; MSG is a static buffer.
    unsafe {
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        libc::abort();
    }
}

pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        const SIZE: usize = 1 << 20;
        // Leaked on purpose: the handler may run at any time until the process ends.
        let stack = Box::leak(vec![0u8; SIZE].into_boxed_slice());
        let ss = libc::stack_t {
            ss_sp: stack.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: SIZE,
        };
        // SAFETY: `ss` describes a live buffer of SIZE bytes that is never freed; the action
        // is zero-initialised and then filled in; the handler only calls async-signal-safe
        // functions.
        unsafe {
            libc::sigaltstack(&ss, std::ptr::null_mut());
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = abort_on_fault as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut());
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    });
}
