//! Output files that appear whole or not at all, and never over one of the command's inputs.
//!
//! A command killed while it writes (Ctrl-C, a scheduler's time limit, a full disk) must not
//! leave a half-written baseline, sweep part or snapshot where the old one was: a later `check` or
//! `merge` would read the torn file, or a user would trust a report folder that mixes two runs.
//! [`write_whole`] writes into a temporary file in the target's own folder (so the final rename
//! stays on one file system and is atomic) and renames it over the target only once every byte is
//! written; until then the old file, if any, is untouched.
//!
//! [`refuse_input`] stops a command from writing over a file it reads (`sweep T --out T`,
//! `check T --baseline T --update`): the same path or the same file under another name.

use crate::error::{Error, ErrorKind, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The folder a file at `path` lives in (`.` for a bare name).
fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes `path` whole: `write` fills a temporary file in the same folder, which then replaces
/// `path` in one rename. On any error (from `write` or the file system) the temporary is removed
/// and `path` keeps what it held. A new file gets the usual `rw-r--r--` permissions; a replaced
/// one keeps its own.
pub fn write_whole(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let name = path.file_name().ok_or_else(|| {
        Error::usage(format!("'{}' names a folder, not a file to write", path.display()))
    })?;
    if path.is_dir() {
        return Err(Error::usage(format!(
            "'{}' is a folder: give the path of a file to write",
            path.display()
        )));
    }
    let io = |e: std::io::Error| Error::io(path, e);
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    let temp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".fragsim-tmp")
        .tempfile_in(folder(path))
        .map_err(io)?;
    {
        let mut w = std::io::BufWriter::new(temp.as_file());
        write(&mut w).map_err(|e| e.in_file(path))?;
        w.flush().map_err(io)?;
    }
    let permissions = match std::fs::metadata(path) {
        Ok(m) => Some(m.permissions()),
        Err(_) => default_permissions(),
    };
    if let Some(p) = permissions {
        temp.as_file().set_permissions(p).map_err(io)?;
    }
    temp.persist(path).map_err(|e| io(e.error))?;
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
    /// A hidden staging folder inside `target` (created if missing), removed when dropped.
    pub fn new(target: &Path) -> Result<Staging> {
        if target.exists() && !target.is_dir() {
            return Err(Error::new(
                ErrorKind::Usage,
                format!(
                    "'{}' is a file, not a folder: --out names the folder the report is written into",
                    target.display()
                ),
            ));
        }
        std::fs::create_dir_all(target).map_err(|e| Error::io(target, e))?;
        let dir = tempfile::Builder::new()
            .prefix(".fragsim-staging-")
            .tempdir_in(target)
            .map_err(|e| Error::io(target, e))?;
        Ok(Staging { dir, target: target.to_path_buf() })
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
            std::fs::rename(f, &to).map_err(|e| Error::io(&to, e))?;
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

/// The (device, inode) of a file, where the platform has them.
#[cfg(unix)]
pub fn identity(m: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

/// The (device, inode) of a file, where the platform has them.
#[cfg(not(unix))]
pub fn identity(_m: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// Refuses to write `output` (given with `flag`) when it is one of `inputs`: fragsim never
/// writes over a file the same command reads.
pub fn refuse_input(output: &Path, flag: &str, inputs: &[&Path]) -> Result<()> {
    match inputs.iter().find(|i| same_file(output, i)) {
        Some(input) => Err(Error::usage(format!(
            "{flag} {}: that file is an input of this command ({}); write the output elsewhere",
            output.display(),
            input.display()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(e.contains("is a file, not a folder"), "{e}");
    }
}
