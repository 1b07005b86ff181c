//! Integration tests: hostile and broken input for every reader.
//!
//! Whatever the file holds, `fragsim info` must exit with code 2 and print one line that names
//! the file, the format it was read as and the place (byte, line or event): never a panic, a
//! hang or memory out of proportion to the file. The hostile-length cases run under a 2 GiB
//! address-space limit, so a reader that trusted a declared length would abort instead of
//! failing cleanly.

use crate::util::*;
use std::path::Path;
use std::process::Output;

/// Runs `fragsim info FILE` with at most 2 GiB of address space.
fn info_limited(path: &Path) -> Output {
    let script = format!(
        "ulimit -v 2097152 && exec '{}' info '{}'",
        env!("CARGO_BIN_EXE_fragsim"),
        path.display()
    );
    std::process::Command::new("sh").args(["-c", &script]).output().expect("sh runs")
}

/// Asserts the run failed as bad input with one line naming `file`, `format` and a place.
#[track_caller]
fn assert_rejected(o: &Output, file: &str, format: &str, why: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{file}: exit {:?}, stderr: {err}", o.status.code());
    assert_eq!(err.lines().count(), 1, "{file}: one line expected: {err}");
    assert!(err.starts_with("fragsim: ") && err.contains(file), "{file}: names the file: {err}");
    assert!(err.contains(&format!(": {format}: ")), "{file}: names format {format}: {err}");
    assert!(
        ["byte ", "line ", "event "].iter().any(|p| err.contains(p)),
        "{file}: names the place: {err}"
    );
    assert!(err.contains(why), "{file}: expected '{why}' in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn reject(name: &str, contents: &[u8], format: &str, why: &str) {
    let (_d, path) = temp_file(name, contents);
    assert_rejected(&info_limited(&path), name, format, why);
}

// --- Kineto JSON -------------------------------------------------------------------------------

const KINETO_OK: &str = r#"{"traceEvents": [
  {"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2, "args": {"External id": 3}},
  {"ph": "i", "name": "[memory]", "ts": 2, "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 512, "Total Allocated": 512, "Total Reserved": 2097152}}
]}"#;

#[test]
fn kineto_good_sample_reads() {
    let (_d, path) = temp_file("ok.json", KINETO_OK.as_bytes());
    let o = info_limited(&path);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn kineto_truncated() {
    let cut = &KINETO_OK.as_bytes()[..KINETO_OK.len() - 30];
    reject("trunc.json", cut, "kineto", "truncated JSON");
}

#[test]
fn kineto_corrupt() {
    let bad = KINETO_OK.replace("\"ts\": 2,", "\"ts\": 2,,");
    reject("corrupt.json", bad.as_bytes(), "kineto", "line 3");
}

#[test]
fn kineto_wrong_shape() {
    reject("other.json", br#"{"name": "not a trace"}"#, "kineto", "no 'traceEvents'");
}

#[test]
fn kineto_negative_and_absurd_sizes() {
    // A negative size is a free; an absurd one (2^61) is rejected.
    let absurd = KINETO_OK.replace("\"Bytes\": 512", "\"Bytes\": -2305843009213693952");
    reject(
        "absurd.json",
        absurd.as_bytes(),
        "kineto",
        "traceEvents[1] ([memory]): Bytes -2305843009213693952: a free of 2^60 bytes or more",
    );
    let fraction = KINETO_OK.replace("\"Bytes\": 512", "\"Bytes\": 1.5");
    reject("fraction.json", fraction.as_bytes(), "kineto", "'Bytes' is not an integer");
    let text = KINETO_OK.replace("\"Bytes\": 512", "\"Bytes\": \"512\"");
    reject("string.json", text.as_bytes(), "kineto", "'Bytes' is not an integer");
    let device = KINETO_OK.replace("\"Device Id\": 0", "\"Device Id\": 99999999999");
    reject(
        "device.json",
        device.as_bytes(),
        "kineto",
        "Device Id 99999999999 is not a device index",
    );
}

#[test]
fn kineto_deeply_nested() {
    let depth = 100_000;
    let nest = |inner: &str| format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth));
    // Valid JSON nested deep inside a field the reader skips: read without recursing.
    let skipped = KINETO_OK.replace("\"External id\": 3", &format!("\"Stack\": {}", nest("")));
    let (_d, path) = temp_file("nested-ok.json", skipped.as_bytes());
    let o = info_limited(&path);
    assert!(o.status.success(), "{}", stderr(&o));
    // Nested inside a field the reader needs: a clear error, no stack overflow.
    let needed = KINETO_OK.replace("\"Bytes\": 512", &format!("\"Bytes\": {}", nest("1")));
    reject("nested-bytes.json", needed.as_bytes(), "kineto", "'Bytes' is not an integer");
    // Never closed.
    reject("nested-bare.json", "[".repeat(depth).as_bytes(), "kineto", "truncated JSON");
    let objects = format!("{{\"traceEvents\": [{{\"name\": {}", "{\"a\": ".repeat(depth));
    reject("nested-objects.json", objects.as_bytes(), "kineto", "line 1");
}

#[test]
fn kineto_huge_number() {
    let huge = KINETO_OK.replace("\"Addr\": 4096", &format!("\"Addr\": 1{}", "0".repeat(400)));
    reject("huge.json", huge.as_bytes(), "kineto", "line 3: number out of range");
}

// --- RMM CSV -----------------------------------------------------------------------------------

const RMM_OK: &str = "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000001,allocate,0x1000,1024,0\n1,10:00:00.000002,free,0x1000,1024,0\n";

#[test]
fn rmm_truncated_line() {
    reject(
        "trunc.csv",
        &RMM_OK.as_bytes()[..RMM_OK.len() - 8],
        "rmm-csv",
        "line 3: expected 6 comma-separated fields",
    );
}

/// Rejects each edit of the valid RMM log: (file name, text replaced, replacement, error).
fn reject_rmm_edits(cases: &[(&str, &str, &str, &str)]) {
    for &(name, from, to, why) in cases {
        assert!(RMM_OK.contains(from), "{name}: the edit applies");
        reject(name, RMM_OK.replace(from, to).as_bytes(), "rmm-csv", why);
    }
}

#[test]
fn rmm_corrupt_fields() {
    reject_rmm_edits(&[
        ("ptr.csv", "0x1000,1024", "0xzz,1024", "line 2: bad pointer '0xzz'"),
        ("time.csv", "10:00:00.000002", "25:61:00", "line 3: bad time '25:61:00'"),
        ("action.csv", ",free,", ",release,", "line 3: unknown action 'release'"),
    ]);
    let mut binary = RMM_OK.as_bytes().to_vec();
    binary.extend([0xff, 0xfe, b'\n']);
    reject("binary.csv", &binary, "rmm-csv", &format!("byte {}: not UTF-8", RMM_OK.len()));
}

#[test]
fn rmm_negative_and_absurd_sizes() {
    let alloc = "allocate,0x1000,1024";
    reject_rmm_edits(&[
        (
            "neg.csv",
            ",1024,0\n1,10:00:00.000002",
            ",-1024,0\n1,10:00:00.000002",
            "line 2: bad size '-1024'",
        ),
        (
            "absurd.csv",
            alloc,
            "allocate,0x1000,1152921504606846976",
            "line 2: size 1152921504606846976 is 2^60 or more",
        ),
        ("overflow.csv", alloc, "allocate,0x1000,99999999999999999999999", "line 2: bad size"),
    ]);
}

// --- .fst --------------------------------------------------------------------------------------

/// A small valid .fst made by `convert` from a text trace.
fn fst_bytes() -> Vec<u8> {
    let (dir, txt) = temp_file("t.txt", b"alloc 0x1000 4096 s0 @1\nfree 0x1000 4096 s0 @2\n");
    let fst = dir.path().join("t.fst");
    let o = run(&["convert", txt.to_str().expect("utf-8"), fst.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::read(fst).expect("read fst")
}

#[test]
fn fst_truncated_corrupt_and_future_version() {
    let data = fst_bytes();
    reject("trunc.fst", &data[..data.len() - 3], "fst", "truncated: the header declares");
    reject("header.fst", &data[..14], "fst", "truncated header");
    let mut flipped = data.clone();
    let last = flipped.len() - 2;
    flipped[last] ^= 0x40;
    reject("flipped.fst", &flipped, "fst", "byte 24: checksum mismatch");
    let mut v9 = data.clone();
    v9[8] = 9;
    reject("v9.fst", &v9, "fst", "byte 8: unsupported .fst version 9");
}

#[test]
fn fst_huge_declared_lengths() {
    // A body whose checksum is right but which declares 2^40 devices, then a 2^40-byte string.
    for body in [
        [&[0u8, 1][..], &[0xfd], &(1u64 << 40).to_le_bytes()].concat(),
        [&[0u8, 1, 0, 1, 1][..], &[0xfd], &(1u64 << 40).to_le_bytes(), b"a.py"].concat(),
    ] {
        let mut crc = flate2::Crc::new();
        crc.update(&body);
        let mut data = b"FRAGSIM\0".to_vec();
        data.extend(fragsim::trace::fst::VERSION.to_le_bytes());
        data.extend((body.len() as u64).to_le_bytes());
        data.extend(crc.sum().to_le_bytes());
        data.extend(&body);
        reject("hostile.fst", &data, "fst", "byte 24: undecodable body");
    }
}

// --- PyTorch snapshot pickle -------------------------------------------------------------------

#[test]
fn pickle_truncated_and_corrupt() {
    let path = real_trace("cs336-lm-step-c.pickle");
    let data = std::fs::read(path).expect("read pickle");
    reject("trunc.pickle", &data[..data.len() / 2], "pytorch-snapshot", "truncated");
    let mut corrupt = data.clone();
    corrupt[5000..5010].fill(0xff);
    reject("corrupt.pickle", &corrupt, "pytorch-snapshot", "byte 500");
}

#[test]
fn pickle_huge_declared_length() {
    // PROTO 4, BINUNICODE8 declaring 2^62 bytes.
    let data = [&[0x80u8, 4, 0x8d][..], &(1u64 << 62).to_le_bytes(), b"abc"].concat();
    reject("huge.pickle", &data, "pytorch-snapshot", "byte 2");
}

#[test]
fn pickle_deeply_nested() {
    // PROTO 4, then 200,000 nested EMPTY_LIST + MARK (never closed), STOP.
    let mut data = vec![0x80u8, 4];
    for _ in 0..200_000 {
        data.extend([b']', b'(']);
    }
    data.push(b'.');
    let (_d, path) = temp_file("nested.pickle", &data);
    let o = info_limited(&path);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("nested.pickle") && stderr(&o).contains("pytorch-snapshot"),
        "{}",
        stderr(&o)
    );
}

// --- any format --------------------------------------------------------------------------------

#[test]
fn empty_and_unrecognised_files() {
    for (name, contents) in [("empty.pickle", &b""[..]), ("blank.json", b"  \n\n")] {
        let (_d, path) = temp_file(name, contents);
        let o = info_limited(&path);
        assert_eq!(o.status.code(), Some(2), "{name}");
        assert_eq!(
            stderr(&o).trim(),
            format!("fragsim: {}: empty file: no trace to read", path.display())
        );
    }
    let (_d, path) = temp_file("trace.csv", b"\x01\x02\x03 binary junk");
    let o = info_limited(&path);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("trace.csv: byte 0: unrecognised trace format"), "{}", stderr(&o));
}

#[test]
fn wrong_format_by_extension_is_read_by_content() {
    // A Kineto trace named .csv is read as Kineto (by content), and its error says so.
    reject("looks.csv", br#"{"traceEvents": [1, 2"#, "kineto", "truncated JSON");
    // An RMM log named .json is read as an RMM log.
    reject("looks.json", b"Thread,Time,Action,Pointer,Size,Stream\n1,2,3\n", "rmm-csv", "line 2");
}

#[test]
fn corrupt_gzip() {
    let mut gz = Vec::new();
    {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::default());
        enc.write_all(KINETO_OK.as_bytes()).expect("compress");
        enc.finish().expect("finish");
    }
    let cut = &gz[..gz.len() / 2];
    let (_d, path) = temp_file("cut.json.gz", cut);
    let o = info_limited(&path);
    assert_eq!(o.status.code(), Some(2));
    assert_rejected(&o, "cut.json.gz", "gzip", "corrupt or truncated gzip stream");
}

#[test]
fn gzip_bomb_is_refused_in_proportion_to_the_file() {
    // 300 MB of zeros compress to about 300 KB: far beyond any real trace's ratio.
    let mut gz = Vec::new();
    {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::fast());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..300 {
            enc.write_all(&zeros).expect("compress");
        }
        enc.finish().expect("finish");
    }
    let (_d, path) = temp_file("bomb.pickle.gz", &gz);
    let o = info_limited(&path);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("bomb.pickle.gz: gzip: gzip stream expands to more than"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("decompression bomb"), "{}", stderr(&o));
    assert!(stderr(&o).contains("decompress it with gunzip -k"), "the way around: {}", stderr(&o));
}

/// A directory given as the trace names the traces in it, so the fix is one copy and paste,
/// for every command that reads a trace.
#[test]
fn a_directory_as_the_trace_lists_the_traces_in_it() {
    let dir = crate::util::bundled("real");
    let d = dir.to_str().unwrap();
    for args in [vec!["replay", d], vec!["info", d], vec!["validate", d], vec!["fit", d]] {
        let out = crate::util::run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = crate::util::stderr(&out);
        assert!(err.contains("is a directory, not a trace"), "{args:?}: {err}");
        assert!(err.contains(&format!("{d}/cs336-lm-step-a.pickle")), "{args:?}: {err}");
        assert!(!err.contains("README.md"), "only files named like traces: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    let many = tempfile::tempdir().unwrap();
    for i in 0..10 {
        std::fs::write(many.path().join(format!("rank{i}.pickle")), b"").unwrap();
    }
    let err = crate::util::stderr(&crate::util::run(&["replay", many.path().to_str().unwrap()]));
    assert!(err.contains("rank7.pickle and 2 more") && !err.contains("rank8"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let out = crate::util::run(&["replay", empty.path().to_str().unwrap()]);
    assert!(crate::util::stderr(&out).contains("holds no file named like a trace"));
}

/// A value quoted in an error is data: its control characters are written out and a long one
/// is cut to 80 characters, marked with its full length, so a 10 MB field makes one short line
/// and an ESC in a file never reaches the terminal (D12). Every reader quotes the same way.
#[test]
fn errors_quote_values_escaped_and_cut_short() {
    let long = "9".repeat(1_000_000);
    let cut = format!("'{}…' (1000000 bytes)", "9".repeat(80));
    let text = |line: &str| format!("alloc 0x1000 4096\n{line}\n").into_bytes();
    let snapshot = |action: &str| {
        let mut e = fragsim::trace::pickle::encode::Encoder::new();
        e.begin_dict();
        e.str("device_traces");
        e.begin_list();
        e.begin_list();
        e.begin_dict();
        e.str("action");
        e.str(action);
        e.end_dict();
        e.end_list();
        e.end_list();
        e.end_dict();
        e.finish()
    };
    let cases: Vec<(&str, Vec<u8>, &str, String)> = vec![
        ("long.txt", text(&format!("alloc 0x2000 {long}")), "text", format!("bad size {cut}")),
        ("nul.txt", text("alloc 0x2000 4096\0"), "text", "bad size '4096\\0'".into()),
        ("esc.txt", text("explode\x1b[2J\x07 1 2"), "text", "'explode\\x1b[2J\\x07'".into()),
        (
            "long.csv",
            RMM_OK.replacen(",0x1000,1024,", &format!(",0x1000,{long},"), 1).into_bytes(),
            "rmm-csv",
            format!("bad size {cut}"),
        ),
        (
            "long.pickle",
            snapshot(&format!("x\x1b[2J\x07{long}")),
            "pytorch-snapshot",
            format!("unknown action 'x\\x1b[2J\\x07{}…' (1000006 bytes)", "9".repeat(68)),
        ),
    ];
    for (name, contents, format, why) in cases {
        let (_d, path) = temp_file(name, &contents);
        let o = info_limited(&path);
        assert_rejected(&o, name, format, &why);
        let err = stderr(&o);
        assert!(err.len() < 600, "{name}: {} bytes: {err}", err.len());
        assert!(!err.trim_end().chars().any(char::is_control), "{name}: {err:?}");
    }
}
