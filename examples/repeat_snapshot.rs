//! Writes a large snapshot made from a real one: its trace entries repeated, as a longer run
//! of the same training step would record them (see `benches/support/repeat.rs`), for
//! measuring whole-process reading speed and memory on a file of any size:
//!
//! ```sh
//! cargo run --release --example repeat_snapshot -- traces/real/cs336-medium-ctx512-train.pickle 15 /tmp/big.pickle
//! ```

#[path = "../benches/support/repeat.rs"]
mod repeat;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, copies, output] = &args[..] else {
        eprintln!("usage: repeat_snapshot SNAPSHOT.pickle COPIES OUT.pickle");
        return ExitCode::from(2);
    };
    let Ok(copies) = copies.parse::<usize>() else {
        eprintln!("repeat_snapshot: COPIES must be a count, not {copies:?}");
        return ExitCode::from(2);
    };
    let written = std::fs::read(input)
        .map_err(|e| format!("{input}: {e}"))
        .and_then(|data| repeat::repeat(&data, copies).map_err(|e| format!("{input}: {e}")))
        .and_then(|out| {
            std::fs::write(output, &out).map_err(|e| format!("{output}: {e}"))?;
            Ok(out.len())
        });
    match written {
        Ok(n) => {
            println!("{output}: {n} bytes ({copies} × the trace entries of {input})");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("repeat_snapshot: {e}");
            ExitCode::from(2)
        }
    }
}
