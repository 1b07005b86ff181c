//! Streamed replays of several policies sharing one reader of the file.
//!
//! A streamed `.fst` replay reads the file itself ([`ReplayInput::streamed`]), so N policies
//! would decode it N times: about 0.07 s of CPU per million events each, more than `pytorch`'s
//! own replay of them. In lockstep one reader decodes the file once and hands its events, a chunk
//! at a time, to every replay of a group, each running the unchanged engine on its own thread.
//! Each replay's channel holds at most [`IN_FLIGHT`] chunks, so memory stays bounded (a few
//! chunks per replay, never the trace) and the reader goes at the pace of the slowest replay; a
//! replay that stops early (an error, `--stop-after`) drops its channel and the reader goes on
//! for the others. The results are those of separate streamed replays, number for number.
//!
//! Only online policies take part: a planner (`offline`) loads every event before its first
//! malloc and never reads the feed, so it runs on its own.

use super::input::Source;
use super::{ReplayInput, ReplayOutput};
use crate::error::{Error, Result};
use crate::trace::fst::FstStream;
use crate::trace::Event;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

/// Events per chunk handed to the replays.
const CHUNK: usize = 16_384;

/// Chunks a replay's channel holds before the reader waits for it.
const IN_FLIGHT: usize = 4;

/// At most this many replays (threads) share one pass over the file; more run in further passes.
pub(super) const GROUP: usize = 64;

/// Consecutive events of the replayed device, from index `first`.
struct Chunk {
    first: u64,
    events: Vec<Event>,
}

/// One replay's end of the shared reader: where [`ReplayInput`]'s walk takes its events from.
pub(super) struct Feed(Mutex<Receiver<Arc<Chunk>>>);

impl Feed {
    /// Hands `f` the events before index `limit`, in order, as the file reader would.
    pub(super) fn each_event(
        &self,
        limit: u64,
        mut f: impl FnMut(u64, &Event) -> Result<()>,
    ) -> Result<()> {
        let rx = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut next = 0;
        while next < limit {
            let Ok(chunk) = rx.recv() else {
                return Err(Error::input(format!(
                    "the shared reader of the file stopped before event {next}"
                )));
            };
            for (i, e) in (chunk.first..).zip(&chunk.events) {
                if i >= limit {
                    return Ok(());
                }
                f(i, e)?;
            }
            next = chunk.first + chunk.events.len() as u64;
        }
        Ok(())
    }
}

/// Runs `run` on a copy of the streamed `input` for each of `indices`, each on its own thread
/// and all fed by one reader of the file up to event `limit`, at most `group` at a time.
/// Returns each index with its outcome, or the reader's error (a file that changed while it was
/// replayed). A loaded input runs the indices one after another.
pub(super) fn run<F>(
    input: &ReplayInput,
    indices: &[usize],
    limit: u64,
    group: usize,
    run: F,
) -> Result<Vec<(usize, Result<ReplayOutput>)>>
where
    F: Fn(usize, &ReplayInput) -> Result<ReplayOutput> + Sync,
{
    let Source::Streamed(stream) = input.source() else {
        return Ok(indices.iter().map(|&i| (i, run(i, input))).collect());
    };
    let mut out = Vec::with_capacity(indices.len());
    for part in indices.chunks(group.max(1)) {
        let mut senders = Vec::with_capacity(part.len());
        let mut fed = Vec::with_capacity(part.len());
        for &index in part {
            let (tx, rx) = sync_channel(IN_FLIGHT);
            senders.push(Some(tx));
            fed.push((index, input.fed(stream, Feed(Mutex::new(rx)))));
        }
        let run = &run;
        let (read, ran) = std::thread::scope(|scope| {
            let replays: Vec<_> = fed
                .into_iter()
                .map(|(index, fed)| scope.spawn(move || (index, run(index, &fed))))
                .collect();
            let read = broadcast(stream.file, input.device(), limit, senders);
            let ran: Vec<_> = replays
                .into_iter()
                .map(|r| r.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect();
            (read, ran)
        });
        read?;
        out.extend(ran);
    }
    Ok(out)
}

/// Reads `device`'s events before `limit` from `file` once, sending each chunk to every replay
/// still listening; stops early when none is.
fn broadcast(
    file: &FstStream,
    device: i32,
    limit: u64,
    mut senders: Vec<Option<SyncSender<Arc<Chunk>>>>,
) -> Result<()> {
    // Sends a chunk to every listener; false when none is left.
    let send = |senders: &mut Vec<Option<SyncSender<Arc<Chunk>>>>, first, events| {
        let chunk = Arc::new(Chunk { first, events });
        for slot in senders.iter_mut() {
            if slot.as_ref().is_some_and(|tx| tx.send(Arc::clone(&chunk)).is_err()) {
                *slot = None; // that replay ended: it will not read again
            }
        }
        senders.iter().any(Option::is_some)
    };
    let mut events = Vec::with_capacity(CHUNK);
    let mut first = 0;
    let mut nobody_left = false;
    let read = file.each_event(device, limit, false, |i, e| {
        events.push(*e);
        if events.len() == CHUNK {
            let full = std::mem::replace(&mut events, Vec::with_capacity(CHUNK));
            if !send(&mut senders, first, full) {
                nobody_left = true;
                return Err(Error::input("no replay is reading"));
            }
            first = i + 1;
        }
        Ok(())
    });
    if nobody_left {
        return Ok(());
    }
    read?;
    if !events.is_empty() {
        send(&mut senders, first, events);
    }
    Ok(())
}
