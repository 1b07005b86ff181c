//! Integration tests: a snapshot pickle read as a stream, whose trace entries are converted and
//! discarded as they are decoded, gives exactly the trace that reading the whole pickle gives.

use crate::util::*;
use fragsim::trace::{read_bytes, read_trace, snapshot, Format, ReadOptions};

fn options(keep_frames: bool) -> ReadOptions {
    ReadOptions { keep_frames, ..ReadOptions::default() }
}

#[test]
fn every_real_snapshot_streams_to_the_whole_readers_trace() {
    let dir = tempfile::tempdir().expect("temp dir");
    for path in real_snapshots() {
        let data = std::fs::read(&path).expect("reads");
        let gz = dir.path().join("s.pickle.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &data).expect("compresses");
        std::fs::write(&gz, enc.finish().expect("compresses")).expect("writes");
        for keep_frames in [false, true] {
            let name = format!("{} (keep_frames {keep_frames})", path.display());
            let whole = snapshot::read(&data, &options(keep_frames)).expect("reads whole");
            // The streamed reader itself, with no fallback to the whole one.
            let streamed = snapshot::stream(&mut &data[..], &options(keep_frames))
                .map_err(snapshot::refusal_error)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(streamed == whole, "{name}: the streamed trace differs");
            assert!(!whole.devices.iter().all(|d| d.events.is_empty()), "{name}: no events");
            assert_eq!(whole.frames.is_empty(), !keep_frames, "{name}");
            // Through a file, plain and gzip-compressed.
            for file in [&path, &gz] {
                let t = read_trace(file, &options(keep_frames)).expect("reads the file");
                assert!(t == whole, "{name}: reading {} differs", file.display());
            }
        }
    }
}

/// `{'device_traces': [[entry 0, entry 1]]}` where entry 1 is `BINGET` of entry 0's dict: a
/// valid pickle (Python writes a shared object that way), but the streamed reader has converted
/// and discarded entry 0, in an earlier `APPENDS` batch, when entry 1 refers back to it.
/// Returns the pickle and the offset of that `BINGET`.
fn shared_entry() -> (Vec<u8>, usize) {
    let key = |data: &mut Vec<u8>, k: &str| {
        data.extend_from_slice(&[0x8c, k.len() as u8]);
        data.extend_from_slice(k.as_bytes());
    };
    // PROTO 4, EMPTY_DICT, MARK, 'device_traces', EMPTY_LIST (the devices), EMPTY_LIST (device
    // 0), MARK, EMPTY_DICT, MEMOIZE (entry 0 is memo 0), MARK, its pairs, SETITEMS, APPENDS.
    let mut data = b"\x80\x04}(".to_vec();
    key(&mut data, "device_traces");
    data.extend_from_slice(b"]](}\x94(");
    key(&mut data, "action");
    key(&mut data, "alloc");
    for (k, v) in [("addr", 4096u16), ("size", 512), ("stream", 0), ("time_us", 7)] {
        key(&mut data, k);
        data.push(b'M');
        data.extend_from_slice(&v.to_le_bytes());
    }
    data.extend_from_slice(b"ue(");
    // BINGET 0, then APPENDS entry 1, APPEND device 0's list, SETITEMS the root, STOP.
    let refer = data.len();
    data.extend_from_slice(b"h\x00eau.");
    (data, refer)
}

#[test]
fn a_stream_that_refers_back_to_a_discarded_entry_is_read_whole_or_refused_by_byte() {
    let (data, refer) = shared_entry();
    let whole = snapshot::read(&data, &options(false)).expect("a valid snapshot");
    let events = &whole.devices[0].events;
    assert_eq!(events.len(), 2, "the same entry twice");
    assert_eq!(events[0], events[1]);
    // The streamed reader alone cannot answer, and says where.
    let e = snapshot::read_from(&mut &data[..], &options(false)).unwrap_err();
    assert_eq!(e.location().place, Some(fragsim::error::Place::Byte(refer as u64)), "{e}");
    assert!(e.to_string().contains("refers back to an object discarded"), "{e}");
    // From memory or from a file, fragsim reads it whole instead.
    assert!(read_bytes(&data, Format::PytorchSnapshot, &options(false)).unwrap() == whole);
    let (_d, path) = temp_file("shared.pickle", &data);
    assert!(read_trace(&path, &options(false)).unwrap() == whole);
}

#[test]
fn from_a_pipe_a_stream_that_refers_back_is_an_input_error_naming_the_byte() {
    use std::io::Write;
    use std::process::Stdio;
    let (data, refer) = shared_entry();
    let mut child = fragsim()
        .args(["info", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fragsim runs");
    child.stdin.take().expect("stdin").write_all(&data).expect("writes the pipe");
    let o = child.wait_with_output().expect("fragsim ends");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "/dev/stdin: pytorch-snapshot: byte {refer}: cannot read this snapshot as a stream"
        )),
        "{}",
        stderr(&o)
    );
}

#[test]
fn frame_lists_shared_across_dropped_batches_keep_their_stacks() {
    use fragsim::trace::{write_to, Action, DeviceTrace, Event, Frame, Trace};
    // The snapshot writer memoizes each stack's frame list once and refers back to it
    // (`BINGET`) from every later entry with the same stack, batches after the first included.
    let mut t = Trace { has_times: true, ..Trace::default() };
    let stacks: Vec<_> = (0..3)
        .map(|s| {
            let frames = (0..=s)
                .map(|k| Frame { filename: format!("f{s}.py"), line: k, name: format!("fn{k}") })
                .collect();
            t.frames.intern(frames)
        })
        .collect();
    let events = (0..2500u64)
        .map(|i| {
            let action = if i % 2 == 0 { Action::Alloc } else { Action::FreeCompleted };
            let mut e = Event::new(action, 0x1000 * (i / 2 + 1), 512, 0, i as i64);
            e.frames = stacks[(i as usize / 2) % 3];
            e
        })
        .collect();
    t.devices.push(DeviceTrace { device: 0, events });
    let mut data = Vec::new();
    write_to(&t, Format::PytorchSnapshot, &mut data).expect("writes");
    let whole = snapshot::read(&data, &options(true)).expect("reads whole");
    assert_eq!(whole.frames.len(), 3);
    let streamed = snapshot::stream(&mut &data[..], &options(true))
        .map_err(snapshot::refusal_error)
        .expect("streams");
    assert!(streamed == whole);
    assert_eq!(streamed.devices[0].events[2499].frames, stacks[(2499 / 2) % 3]);
}

#[path = "../benches/support/repeat.rs"]
mod repeat;

#[test]
fn a_real_snapshot_repeated_streams_to_the_whole_readers_trace() {
    // Many batches whose frame lists refer back to frame dicts, dict keys and action names
    // memoized batches (and discards) earlier: the memo entries that survived each discard are
    // found by index, far behind the current batch.
    let real = std::fs::read(real_trace("cs336-lm-step-c.pickle")).expect("reads");
    let data = repeat::repeat(&real, 4).expect("repeats");
    let once = snapshot::read(&real, &options(true)).expect("reads whole");
    for keep_frames in [false, true] {
        let whole = snapshot::read(&data, &options(keep_frames)).expect("reads whole");
        let streamed = snapshot::stream(&mut &data[..], &options(keep_frames))
            .map_err(snapshot::refusal_error)
            .unwrap_or_else(|e| panic!("keep_frames {keep_frames}: {e}"));
        assert!(streamed == whole, "keep_frames {keep_frames}: the streamed trace differs");
        let (n, events) = (once.devices[0].events.len(), &whole.devices[0].events);
        assert_eq!(events.len(), 4 * n);
        // The fourth repetition is the first one again, later, with the same stacks.
        let (first, last) = (&once.devices[0].events, &events[3 * n..]);
        assert!(first
            .iter()
            .zip(last)
            .all(|(a, b)| (a.action, a.addr, a.size) == (b.action, b.addr, b.size)));
        assert!(last[0].time_us > first[n - 1].time_us);
        if keep_frames {
            assert_eq!(whole.frames.len(), once.frames.len());
            let stack = |t: &fragsim::trace::Trace, e: &fragsim::trace::Event| {
                t.frames.get(e.frames).to_vec()
            };
            assert!(first.iter().zip(last).all(|(a, b)| stack(&once, a) == stack(&whole, b)));
        }
    }
}

/// A protocol-4 pickle written opcode by opcode, counting `MEMOIZE`s.
#[derive(Default)]
struct Asm {
    data: Vec<u8>,
    memo: u8,
}

impl Asm {
    /// Appends opcodes; `m` memoizes the object on top and returns its memo index.
    fn op(&mut self, ops: &[u8]) -> &mut Self {
        self.data.extend_from_slice(ops);
        self
    }
    fn m(&mut self) -> u8 {
        self.data.push(0x94);
        self.memo += 1;
        self.memo - 1
    }
    fn str(&mut self, t: &str) -> &mut Self {
        self.data.extend_from_slice(&[0x8c, t.len() as u8]);
        self.data.extend_from_slice(t.as_bytes());
        self.m();
        self
    }
    /// `{'name': name, 'filename': 'x.py', 'line': 3}`, memoized; returns its memo index.
    fn frame(&mut self, name: &str) -> u8 {
        self.op(b"}");
        let i = self.m();
        self.op(b"(").str("name").str(name).str("filename").str("x.py").str("line");
        self.op(b"K\x03u");
        i
    }
    /// An alloc entry at `addr` whose frames `frames` writes (between `MARK` and `APPENDS`).
    fn entry(&mut self, addr: u16, frames: impl FnOnce(&mut Asm)) {
        self.op(b"}");
        self.m();
        self.op(b"(").str("action").str("alloc").str("addr").op(b"M");
        self.op(&addr.to_le_bytes()).str("size").op(b"M\x00\x02").str("stream").op(b"K\x00");
        self.str("frames").op(b"]");
        self.m();
        self.op(b"(");
        frames(self);
        self.op(b"eu");
    }
}

/// Found in review while fuzzing the streamed reader (the fuzzer had not reached it): a frame
/// dict met again through the memo (`BINGET` of the handle it became when its batch was
/// dropped) and memoized again, in a batch that then memoizes a new frame dict. Both survive
/// the next discard as handles and must be added in memo order: the re-memoized one went in
/// last, out of order, which panicked (debug builds) or lost the entry (release builds), so
/// that a later batch referring back to it was refused.
#[test]
fn a_frame_memoized_again_survives_the_next_discard() {
    let mut a = Asm::default();
    a.op(b"\x80\x04}");
    a.m();
    a.op(b"(").str("segments").op(b"]");
    a.m();
    a.str("device_traces").op(b"]");
    a.m();
    a.op(b"]");
    a.m();
    // Batch 1: frames [f]; the batch is dropped and f survives as a handle.
    let mut f = 0;
    a.op(b"(").entry(0x1000, |a| f = a.frame("f"));
    // Batch 2: frames [BINGET f, memoized again as g, a new frame h].
    let mut g = 0;
    a.op(b"e(").entry(0x2000, |a| {
        a.op(&[b'h', f]);
        g = a.m();
        a.frame("h");
    });
    // Batch 3: frames [BINGET g].
    a.op(b"e(").entry(0x3000, |a| {
        a.op(&[b'h', g]);
    });
    a.op(b"eau.");
    let data = a.data;
    let whole = snapshot::read(&data, &options(true)).expect("reads whole");
    let names = |t: &fragsim::trace::Trace, i: usize| -> Vec<String> {
        t.frames.get(t.devices[0].events[i].frames).iter().map(|f| f.name.clone()).collect()
    };
    assert_eq!(names(&whole, 1), ["f", "h"]);
    assert_eq!(names(&whole, 2), ["f"]);
    let streamed = snapshot::stream(&mut &data[..], &options(true))
        .map_err(snapshot::refusal_error)
        .expect("streams");
    assert!(streamed == whole);
    fragsim::testing::fuzz::read(&data, Format::PytorchSnapshot);
}
