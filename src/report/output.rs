//! Where fragsim writes: one rule for every output a command names (`--out`,
//! `--export-snapshot`, `--flamegraph`, `report --out`, `diff --out`, `check --update`,
//! `convert`, `synth`). See docs/interface.md, "Outputs".
//!
//! - A **regular file** (or a path where nothing stands yet) is written whole or not at all: a
//!   temporary file in the same folder is filled and renamed over the target only once every
//!   byte is written ([`write_whole`]). A command killed on the way, or one that fails, leaves
//!   the old file as it was.
//! - A **folder** (`report --out`, `diff --out`) gets its files built in a staging folder inside
//!   it, then renamed in one by one with the page that links them last ([`Staging`]).
//! - A **character device, FIFO or socket** (`/dev/null`, a named pipe), and **stdout** (`-`,
//!   `/dev/stdout`), are written straight through: fragsim never replaces them with a file.
//! - A **symbolic link** is followed: its target is written by the rules above and the link
//!   stays a link (a dangling link's target is created).
//! - A **block device** is refused.
//!
//! [`refuse_input`] and [`refuse_input_in_folder`] stop a command before any work from writing
//! over a file it reads (`convert T T`, `sweep T --out T`, `diff A B --out DIR` with A in DIR):
//! the same path, or the same file (device and inode) under another name.

use crate::error::{os_reason, Error, ErrorKind, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where an output path leads once its symbolic links are followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `-` or `/dev/stdout`: the process's standard output, written straight through.
    Stdout,
    /// A character device, FIFO or socket, or an open descriptor's path (`/dev/stderr`,
    /// `/dev/fd/N`): opened for writing, never created, truncated or replaced.
    Stream(PathBuf),
    /// A regular file, or nothing yet: staged beside it and renamed over it.
    File(PathBuf),
    /// A folder that exists, or nothing yet where a folder is wanted.
    Folder(PathBuf),
}

/// The most symbolic links followed from one output path (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Whether `path` names an open descriptor rather than a file (`/dev/fd/1`, `/proc/self/fd/3`):
/// such a path is a "magic" link that cannot be followed by reading it.
fn is_descriptor(path: &Path) -> bool {
    let s = path.to_string_lossy();
    s == "/dev/stderr"
        || s == "/dev/stdin"
        || s.starts_with("/dev/fd/")
        || (s.starts_with("/proc/") && s.contains("/fd/"))
}

/// `path` with every symbolic link at its end followed: the file that writing it changes.
fn follow_links(path: &Path) -> Result<PathBuf> {
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        if is_descriptor(&at) {
            return Ok(at);
        }
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&at).map_err(|e| failed(path, "follow the link", e))?;
                at = if to.is_absolute() { to } else { folder(&at).join(to) };
            }
            _ => return Ok(at),
        }
    }
    Err(Error::usage(format!(
        "'{}': more than {MAX_LINKS} symbolic links in a row (a loop?); give the file to write",
        path.display()
    )))
}

/// An I/O failure on an output, worded by fragsim: `cannot {doing} '{path}': {reason}`
/// ([`os_reason`], but a missing folder is named as such).
fn failed(path: &Path, doing: &str, e: std::io::Error) -> Error {
    let reason = match e.kind() {
        std::io::ErrorKind::NotFound => "its folder does not exist".to_string(),
        _ => os_reason(&e),
    };
    Error::io_worded(format!("cannot {doing} '{}': {reason}", path.display()), e)
}

/// An error the writer of the output `path` returned. One that an I/O failure caused (a full
/// disk under `convert`, `synth` or `--export-snapshot`) is worded as every output's is,
/// `cannot write 'PATH': REASON`, not as the OS's bare text; a closed pipe stays as it is (the
/// binary stops quietly on it), and any other (an encoding refused, a cancel) names the file.
fn writer_failed(path: &Path, e: Error) -> Error {
    let io = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
    match io {
        Some(io) if !e.is_broken_pipe() => {
            failed(path, "write", std::io::Error::new(io.kind(), io.to_string()))
        }
        _ => e.in_file(path),
    }
}

/// Where writing the file `path` (given with `flag`) leads: see [`Target`]. A folder or a block
/// device is refused.
pub(crate) fn file_target(path: &Path, flag: &str) -> Result<Target> {
    if path == Path::new("-") || path == Path::new("/dev/stdout") {
        return Ok(Target::Stdout);
    }
    let at = follow_links(path)?;
    if is_descriptor(&at) {
        return Ok(Target::Stream(at));
    }
    match std::fs::metadata(&at) {
        Err(_) => Ok(Target::File(at)),
        Ok(m) if m.is_dir() => Err(Error::usage(format!(
            "{flag} {}: that is a folder; give the path of a file to write",
            path.display()
        ))),
        Ok(m) if m.is_file() => Ok(Target::File(at)),
        Ok(m) if is_block_device(&m) => Err(Error::usage(format!(
            "{flag} {}: that is a block device; fragsim writes files, character devices and FIFOs",
            path.display()
        ))),
        Ok(_) => Ok(Target::Stream(at)),
    }
}

/// Where writing the folder `path` (given with `flag`) leads: an existing folder or a path
/// where nothing stands (through links). Stdout, a file or a device is refused.
pub fn folder_target(path: &Path, flag: &str) -> Result<Target> {
    let not_folder = |what: &str| {
        Error::usage(format!(
            "{flag} {}: that is {what}, not a folder: {flag} names the folder the files are written into",
            path.display()
        ))
    };
    if path == Path::new("-") || path == Path::new("/dev/stdout") {
        return Err(not_folder("stdout"));
    }
    let at = follow_links(path)?;
    match std::fs::metadata(&at) {
        Err(_) if is_descriptor(&at) => Err(not_folder("a descriptor")),
        Err(_) => Ok(Target::Folder(at)),
        Ok(m) if m.is_dir() => Ok(Target::Folder(at)),
        Ok(m) if m.is_file() => Err(not_folder("a file")),
        Ok(_) => Err(not_folder("a device or FIFO")),
    }
}

#[cfg(unix)]
fn is_block_device(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_block_device()
}

#[cfg(not(unix))]
fn is_block_device(_m: &std::fs::Metadata) -> bool {
    false
}

/// The folder a file at `path` lives in (`.` for a bare name).
fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes the output `path` by the rule of [`Target`]: `write` fills a temporary file that then
/// replaces a regular file in one rename (on any error the temporary is removed and `path`
/// keeps what it held; a new file gets `rw-r--r--`, a replaced one keeps its permissions), or
/// it writes straight into stdout, a character device or a FIFO. Errors name `path` as given.
pub fn write_whole(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    write_output(path, "the output", write)
}

/// [`write_whole`], naming the output by its `flag` in a refusal (`--out`, `--flamegraph`).
pub fn write_output(
    path: &Path,
    flag: &str,
    write: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    match file_target(path, flag)? {
        Target::Stdout => {
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::new(stdout.lock());
            write(&mut w)?;
            w.flush().map_err(|e| Error::writing("to stdout", e))
        }
        Target::Stream(at) => {
            // No create, no truncate: a device or FIFO is written as it stands.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&at)
                .map_err(|e| failed(path, "open for writing", e))?;
            let mut w = std::io::BufWriter::new(file);
            write(&mut w).map_err(|e| writer_failed(path, e))?;
            w.flush().map_err(|e| failed(path, "write", e))
        }
        Target::File(at) | Target::Folder(at) => stage_file(path, &at, write),
    }
}

/// Fills a temporary file beside `at` and renames it over `at`; errors name `path`.
fn stage_file(
    path: &Path,
    at: &Path,
    write: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    let name = at.file_name().ok_or_else(|| {
        Error::usage(format!("'{}' names a folder, not a file to write", path.display()))
    })?;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    let temp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".fragsim-tmp")
        .tempfile_in(folder(at))
        .map_err(|e| failed(path, "write", e))?;
    {
        let mut w = std::io::BufWriter::new(temp.as_file());
        write(&mut w).map_err(|e| writer_failed(path, e))?;
        w.flush().map_err(|e| failed(path, "write", e))?;
    }
    let permissions = match std::fs::metadata(at) {
        Ok(m) => Some(m.permissions()),
        Err(_) => default_permissions(),
    };
    if let Some(p) = permissions {
        temp.as_file().set_permissions(p).map_err(|e| failed(path, "write", e))?;
    }
    temp.persist(at).map_err(|e| failed(path, "replace", e.error))?;
    Ok(())
}

#[cfg(unix)]
fn default_permissions() -> Option<std::fs::Permissions> {
    use std::os::unix::fs::PermissionsExt;
    Some(std::fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn default_permissions() -> Option<std::fs::Permissions> {
    None
}

/// [`write_whole`] of `bytes`.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_whole(path, |w| w.write_all(bytes).map_err(|e| Error::writing("the file", e)))
}

/// A folder in which a set of files is built before they replace the ones of the same names in
/// the target folder: see [`Staging::commit`].
#[derive(Debug)]
pub struct Staging {
    dir: tempfile::TempDir,
    target: PathBuf,
}

impl Staging {
    /// A hidden staging folder inside `target` (created if missing; a link is followed, a
    /// dangling one makes its target), removed when dropped. `target` must be a folder or
    /// nothing yet (see [`folder_target`]).
    pub fn new(target: &Path) -> Result<Staging> {
        Staging::for_flag(target, "--out")
    }

    /// [`Staging::new`], naming the output by its `flag` in a refusal.
    pub(crate) fn for_flag(target: &Path, flag: &str) -> Result<Staging> {
        let Target::Folder(at) = folder_target(target, flag)? else {
            return Err(Error::usage(format!("{flag} {}: not a folder", target.display())));
        };
        std::fs::create_dir_all(&at).map_err(|e| failed(target, "create the folder", e))?;
        let dir = tempfile::Builder::new()
            .prefix(".fragsim-staging-")
            .tempdir_in(&at)
            .map_err(|e| failed(target, "write into the folder", e))?;
        Ok(Staging { dir, target: at })
    }

    /// Where the files are built.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Moves every file built (`files`, paths inside [`Staging::path`]) into the target folder,
    /// each in one rename, `last` (e.g. `index.html`, the page that links the others) after all
    /// the rest; returns their final paths. Until `last` is renamed, the target's old `last`
    /// stays in place, so a folder whose `last` is new holds every new file, each whole.
    pub fn commit(self, files: &[PathBuf], last: &str) -> Result<Vec<PathBuf>> {
        let (first, then): (Vec<&PathBuf>, Vec<&PathBuf>) =
            files.iter().partition(|f| f.file_name().is_none_or(|n| n != last));
        let mut out = Vec::with_capacity(files.len());
        for f in first.into_iter().chain(then) {
            let name = f.file_name().ok_or_else(|| {
                Error::new(ErrorKind::Io, format!("'{}' names no file", f.display()))
            })?;
            let to = self.target.join(name);
            std::fs::rename(f, &to).map_err(|e| failed(&to, "replace", e))?;
            out.push(to);
        }
        Ok(out)
    }
}

/// Whether `a` and `b` name the same file: the same path, or (when both exist) the same device
/// and inode, so `./t.json` and `t.json`, or a hard link, count as one.
pub fn same_file(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(ma), Ok(mb)) => identity(&ma) == identity(&mb) && identity(&ma).is_some(),
        _ => match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(ca), Ok(cb)) => ca == cb,
            _ => false,
        },
    }
}

/// The paths of a command's inputs, each once: a path named again (the same text, or the same
/// file under another name) is dropped with a note from `note`. Each file is then read once, and a
/// FIFO named twice is not opened a second time, which would wait forever for a writer.
pub fn distinct_inputs(paths: &[PathBuf], mut note: impl FnMut(&str)) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        let key =
            std::fs::metadata(p).ok().and_then(|m| identity(&m)).map_or_else(|| Err(p.clone()), Ok);
        if seen.insert(key) {
            out.push(p.clone());
        } else {
            note(&format!(
                "note: {} is named twice; it is read once",
                crate::error::printable(&p.display().to_string())
            ));
        }
    }
    out
}

/// The (device, inode) of a file, where the platform has them.
#[cfg(unix)]
pub fn identity(m: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

/// The (device, inode) of a file, where the platform has them.
#[cfg(not(unix))]
pub(crate) fn identity(_m: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// Refuses to write `output` (given with `flag`) when it is one of `inputs`: fragsim never
/// writes over a file the same command reads. Stdout (`-`) is no input's file.
/// A folder or a block device as `output` is refused here too, before any work.
pub fn refuse_input(output: &Path, flag: &str, inputs: &[&Path]) -> Result<()> {
    file_target(output, flag)?;
    refuse_same(output, flag, inputs)
}

/// [`refuse_input`] without the check of what `output` is.
fn refuse_same(output: &Path, flag: &str, inputs: &[&Path]) -> Result<()> {
    if output == Path::new("-") {
        return Ok(());
    }
    match inputs.iter().find(|i| **i != Path::new("-") && same_file(output, i)) {
        Some(input) => Err(Error::usage(format!(
            "{flag} {}: that file is an input of this command ({}); write the output elsewhere",
            output.display(),
            input.display()
        ))),
        None => Ok(()),
    }
}

/// Refuses to write the folder `output` (given with `flag`) when it holds one of `inputs`, at
/// any depth, or is one: the files a command writes into a folder must not replace what it reads.
/// An `output` that is no folder (stdout, a file, a device) is refused here too, before any work.
pub fn refuse_input_in_folder(output: &Path, flag: &str, inputs: &[&Path]) -> Result<()> {
    refuse_same(output, flag, inputs)?;
    folder_target(output, flag)?;
    let Ok(dir) = std::fs::canonicalize(output) else {
        return Ok(()); // nothing there yet: it holds no input
    };
    for input in inputs.iter().filter(|i| **i != Path::new("-")) {
        if std::fs::canonicalize(input).is_ok_and(|i| i.starts_with(&dir)) {
            return Err(Error::usage(format!(
                "{flag} {}: that folder holds {}, an input of this command; write the output \
                 elsewhere",
                output.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that fails as a full disk does, for every output: the file and the device
    /// alike say `cannot write 'PATH': no space left on the device`, never the OS's bare
    /// `No space left on device (os error 28)` (D15); a closed pipe stays a closed pipe.
    #[test]
    fn a_writer_failing_on_a_full_disk_is_worded_as_every_output_is() {
        let full = || std::io::Error::from(std::io::ErrorKind::StorageFull);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        for writer in [
            Error::from_io(full()),
            Error::writing("the file", full()),
            Error::io(Path::new("elsewhere"), full()),
        ] {
            let mut writer = Some(writer);
            let e = write_whole(&path, |_| Err(writer.take().unwrap())).unwrap_err();
            let want = format!("cannot write '{}': no space left on the device", path.display());
            assert_eq!(e.to_string(), want);
            assert_eq!(e.kind(), ErrorKind::Io);
        }
        assert!(!path.exists(), "nothing is left behind");
        let pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let e = write_whole(&path, |_| Err(Error::from_io(pipe))).unwrap_err();
        assert!(e.is_broken_pipe(), "{e}");
        // An error that is no I/O failure (an encoding refused) keeps its words.
        let e = write_whole(&path, |_| Err(Error::input("size beyond 2^60"))).unwrap_err();
        assert_eq!(e.to_string(), format!("{}: size beyond 2^60", path.display()));
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        write_bytes(&path, b"old").unwrap();
        let e = write_whole(&path, |w| {
            w.write_all(b"half").unwrap();
            Err(Error::input("stopped"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("out.json"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        write_bytes(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn a_folder_is_no_file_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_bytes(dir.path(), b"x").unwrap_err().to_string();
        assert!(e.contains("is a folder"), "{e}");
    }

    #[test]
    fn an_input_is_refused_under_any_name() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.txt");
        std::fs::write(&a, "x").unwrap();
        let again = dir.path().join(".").join("a.txt");
        let e = refuse_input(&again, "--out", &[Path::new("b"), &a]).unwrap_err().to_string();
        assert!(e.contains("--out") && e.contains("an input"), "{e}");
        assert!(refuse_input(&dir.path().join("new"), "--out", &[&a]).is_ok());
        let e = refuse_input_in_folder(dir.path(), "--out", &[&a]).unwrap_err().to_string();
        assert!(e.contains("that folder holds"), "{e}");
        assert!(refuse_input_in_folder(&dir.path().join("new"), "--out", &[&a]).is_ok());
    }

    #[cfg(unix)]
    #[test]
    fn a_link_is_followed_and_stays_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.json");
        let link = dir.path().join("link.json");
        std::fs::write(&target, "old").unwrap();
        std::os::unix::fs::symlink("target.json", &link).unwrap();
        write_bytes(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        // A dangling link makes its target; a loop is refused.
        let dangling = dir.path().join("dangling.json");
        std::os::unix::fs::symlink("made.json", &dangling).unwrap();
        write_bytes(&dangling, b"made").unwrap();
        assert_eq!(std::fs::read(dir.path().join("made.json")).unwrap(), b"made");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::os::unix::fs::symlink("b", &a).unwrap();
        std::os::unix::fs::symlink("a", &b).unwrap();
        let e = write_bytes(&a, b"x").unwrap_err().to_string();
        assert!(e.contains("symbolic links in a row"), "{e}");
    }

    #[test]
    fn staged_files_move_in_with_the_last_one_last() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("report");
        let staging = Staging::new(&target).unwrap();
        let files: Vec<PathBuf> = ["index.html", "a.png"]
            .iter()
            .map(|n| {
                let p = staging.path().join(n);
                std::fs::write(&p, n).unwrap();
                p
            })
            .collect();
        let out = staging.commit(&files, "index.html").unwrap();
        assert_eq!(out, vec![target.join("a.png"), target.join("index.html")]);
        let left: Vec<_> = std::fs::read_dir(&target).unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(left.len(), 2, "the staging folder is gone: {left:?}");
        let e = Staging::new(&target.join("a.png")).unwrap_err().to_string();
        assert!(e.contains("a file, not a folder"), "{e}");
    }
}
