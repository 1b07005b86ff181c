//! The command line as users and scripts run it.

use crate::util::*;

#[test]
fn replay_bound_on_a_text_trace_prints_the_live_peak() {
    let (_d, path) =
        temp_file("t.txt", b"alloc 0x1000 4096 s0\nalloc 0x2000 1000 s0\nfree 0x1000 4096 s0\n");
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "bound", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["results"][0]["policy"], "bound");
    assert_eq!(v["results"][0]["peak_reserved_bytes"], 5096);
    assert_eq!(v["format"], "text");
    assert_eq!(v["events"], 4);
}

#[test]
fn unknown_policy_is_a_usage_error_listing_the_accepted_ones() {
    let (_d, path) = temp_file("t.txt", b"alloc 0x1000 4096 s0\n");
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "tlsf"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown policy 'tlsf'") && stderr(&o).contains("bound"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unreadable_input_names_the_file() {
    let (_d, path) = temp_file("junk.bin", b"\x00\x01\x02 not a trace");
    let o = run(&["replay", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("junk.bin") && stderr(&o).contains("unrecognised trace format"),
        "{}",
        stderr(&o)
    );
}
