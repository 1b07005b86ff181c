//! Ctrl-C during a replay on a real GPU: stop, give the memory back, exit 130.
//!
//! Killed by SIGINT's default action, fragsim would leave freeing its GPU memory to the driver's
//! process teardown. Instead, opening the cuda backend installs a handler that only sets a flag
//! ([`Cancel::interrupt`](crate::error::Cancel::interrupt), the one async-signal-safe thing to
//! do) and restores the default action, so a second Ctrl-C still kills at once. The replay sees
//! the flag as every long work sees its [`Cancel`](crate::error::Cancel) and returns an
//! error; unwinding drops the backend, which frees everything; the binary exits with 130.

use std::sync::Once;

#[cfg(unix)]
mod imp {
    use std::ffi::c_int;

    const SIGINT: c_int = 2;
    const SIG_DFL: usize = 0;

    extern "C" {
        // POSIX `signal`; std already links the C library that defines it.
        fn signal(signum: c_int, handler: usize) -> usize;
    }

    extern "C" fn on_sigint(_: c_int) {
        crate::error::Cancel::interrupt();
        // SAFETY: `signal` is async-signal-safe; restoring the default lets a second Ctrl-C kill.
        unsafe { signal(SIGINT, SIG_DFL) };
    }

    pub fn install() {
        let handler: extern "C" fn(c_int) = on_sigint;
        // SAFETY: the handler only stores to an atomic and calls `signal`, both signal-safe.
        unsafe { signal(SIGINT, handler as usize) };
    }
}

#[cfg(not(unix))]
mod imp {
    pub(crate) fn install() {}
}

/// Installs the SIGINT handler, once per process.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(imp::install);
}
