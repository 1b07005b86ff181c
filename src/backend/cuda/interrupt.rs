//! Ctrl-C during a replay on a real GPU: stop, give the memory back, exit 130.
//!
//! Killed by SIGINT's default action, fragsim would leave freeing its GPU memory to the driver's
//! process teardown. Instead, opening the cuda backend installs a handler that only sets a flag
//! (the one async-signal-safe thing to do) and restores the default action, so a second Ctrl-C
//! still kills at once. The replay loop on a backend that holds device memory
//! ([`Backend::HOLDS_DEVICE_MEMORY`](crate::backend::Backend::HOLDS_DEVICE_MEMORY)) polls
//! [`requested`] after every event and returns an error; unwinding drops the backend, which
//! frees everything; the binary exits with 130.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The exit code after an interrupted replay (128 + SIGINT, as shells report it).
pub const EXIT_CODE: u8 = 130;

/// True once SIGINT arrived after [`install`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

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
        super::REQUESTED.store(true, std::sync::atomic::Ordering::Relaxed);
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
    pub fn install() {}
}

/// Installs the SIGINT handler, once per process.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(imp::install);
}
