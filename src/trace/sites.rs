//! Allocation sites: which line of the user's code a trace entry's stack names, and which of its
//! frames to show.
//!
//! One rule, used by `blame`, `diff`, OOM lines and the report (docs/interface.md, "Sites"). A
//! stack (innermost frame first, as PyTorch records it) names as its *site*:
//!
//! 1. the innermost Python frame whose file is not inside an installed package or the Python
//!    standard library (`site-packages`, `dist-packages`, `lib/pythonX.Y/`, `<frozen ...>`),
//!    written `FILE:LINE:FUNCTION` as recorded: the user's own code;
//! 2. else the innermost Python frame;
//! 3. else the innermost autograd node, `backward:NAME` from a frame
//!    `torch::autograd::generated::NAME::apply` (the autograd engine allocates in its own thread,
//!    with no Python frame);
//! 4. else the innermost ATen op, `op:NAME` from `at::_ops::NAME::call`;
//! 5. else `(no Python frame)`, or `(no frames)` for an entry without frames.
//!
//! Python frames are told from C/C++ ones by their file: a `.py` file, or a pseudo-file such
//! as `<string>` or `<eval_with_key>.3` (code that `torch.fx` and `exec` compile).
//!
//! `shown` is memory_viz's frame filter: it hides the unwinder, the traceback gatherer,
//! CPython's eval loop and call machinery, and the dispatcher's boxing and registration files,
//! so a stack shown to a person starts with frames that mean something to them.
//!
//! [`SiteTable`] computes every interned stack's site once, so attributing millions of events
//! costs one lookup each.

use super::{Frame, FrameTable, FramesId};
use std::collections::HashMap;

/// The site of an entry without frames.
pub const NO_FRAMES: &str = "(no frames)";

/// The site of a stack with frames but no Python frame, autograd node or ATen op.
pub const NO_PYTHON_FRAME: &str = "(no Python frame)";

/// The site of a block live before the trace begins whose stack the dump does not hold.
pub const BEFORE_THE_TRACE: &str = "(before the trace)";

/// True for a Python frame: a `.py` file, or a pseudo-file such as `<string>`.
pub(crate) fn is_python(f: &Frame) -> bool {
    f.filename.ends_with(".py") || (f.filename.starts_with('<') && f.line > 0)
}

/// True for a file inside an installed package or the Python standard library (Windows
/// separators read as `/`).
pub(crate) fn is_library(filename: &str) -> bool {
    let slashed;
    let filename = if filename.contains('\\') {
        slashed = filename.replace('\\', "/");
        slashed.as_str()
    } else {
        filename
    };
    filename.contains("site-packages/")
        || filename.contains("dist-packages/")
        || filename.starts_with("<frozen ")
        || in_python_lib(filename)
}

/// True when `filename` has a path component `lib/pythonX.Y/` (or `lib/pythonX.Yt/`).
fn in_python_lib(filename: &str) -> bool {
    filename.match_indices("lib/python").any(|(i, m)| {
        let at_component = i == 0 || filename.as_bytes()[i - 1] == b'/';
        let rest = &filename[i + m.len()..];
        let version: String =
            rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 't').collect();
        at_component
            && version.contains('.')
            && version.starts_with(|c: char| c.is_ascii_digit())
            && rest[version.len()..].starts_with('/')
    })
}

/// True for the user's own Python code: a Python frame outside packages and the standard library.
pub(crate) fn is_user(f: &Frame) -> bool {
    is_python(f) && !is_library(&f.filename)
}

/// A frame written as a site: `FILE:LINE:FUNCTION`, control characters written out
/// ([`printable`]).
pub(crate) fn describe(f: &Frame) -> String {
    format!("{}:{}:{}", printable(&f.filename), f.line, printable(&f.name))
}

/// `s` escaped for XML text and attribute values (SVG, HTML), control characters written out
/// (`printable`): the one rule every chart and page fragsim writes uses, so the file is
/// well-formed XML whatever a trace names.
pub fn xml_escape(s: &str) -> String {
    let s = printable(s);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Control characters written out, the one rule for names from a trace; it lives with the
/// error type, the lowest layer, so every error that quotes a value uses it too.
pub use crate::error::printable;

/// The site of `frames` (innermost first); see the module docs.
pub fn site_of(frames: &[Frame]) -> String {
    if frames.is_empty() {
        return NO_FRAMES.to_string();
    }
    if let Some(f) = frames.iter().find(|f| is_user(f)) {
        return describe(f);
    }
    if let Some(f) = frames.iter().find(|f| is_python(f)) {
        return describe(f);
    }
    if let Some(name) = frames.iter().find_map(|f| autograd_node(&f.name)) {
        return format!("backward:{name}");
    }
    if let Some(name) = frames.iter().find_map(|f| aten_op(&f.name)) {
        return format!("op:{name}");
    }
    NO_PYTHON_FRAME.to_string()
}

/// `NAME` of a frame `torch::autograd::generated::NAME::apply(...)`.
fn autograd_node(name: &str) -> Option<&str> {
    let rest = &name[name.find("torch::autograd::generated::")? + 28..];
    let end = rest.find("::apply")?;
    let node = &rest[..end];
    (!node.is_empty() && !node.contains([' ', '(', '<'])).then_some(node)
}

/// `NAME` of a frame `at::_ops::NAME::call(...)`.
fn aten_op(name: &str) -> Option<&str> {
    let rest = &name[name.find("at::_ops::")? + 10..];
    let end = rest.find("::call")?;
    let after = &rest[end + 6..];
    let op = &rest[..end];
    let whole = after.is_empty() || after.starts_with('(');
    (whole && !op.is_empty() && !op.contains([' ', '(', '<', ':'])).then_some(op)
}

/// memory_viz's frame filter: false for the frames it hides (the unwinder, the traceback
/// gatherer, CPython's eval loop and call machinery, dispatcher boxing and registration files).
pub(crate) fn shown(f: &Frame) -> bool {
    const FUNCTIONS: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const FILES: [&str; 10] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    !FUNCTIONS.iter().any(|s| f.name.contains(s)) && !FILES.iter().any(|s| f.filename.contains(s))
}

/// `frames` as a person should read them: the user's frames first (innermost first), then the
/// rest that [`shown`] keeps, each `FILE:LINE:FUNCTION` (C++ frames without a file: the name).
pub(crate) fn display(frames: &[Frame]) -> Vec<String> {
    let user = frames.iter().filter(|f| is_user(f));
    let rest = frames.iter().filter(|f| shown(f) && !is_user(f));
    user.chain(rest).map(display_frame).collect()
}

/// One frame for [`display`].
fn display_frame(f: &Frame) -> String {
    match f.filename.as_str() {
        "" | "??" => printable(&f.name).into_owned(),
        _ => describe(f),
    }
}

/// A site's key parts, for grouping by function or file: `(file, function)` of a
/// `FILE:LINE:FUNCTION` site; the whole site for the others.
pub(crate) fn site_parts(site: &str) -> (&str, &str) {
    let mut it = site.rsplitn(3, ':');
    match (it.next(), it.next(), it.next()) {
        (Some(function), Some(line), Some(file))
            if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) =>
        {
            (file, function)
        }
        _ => (site, site),
    }
}

/// `site` with its file cut to the last two components of its path (`\` read as `/`), e.g.
/// `pkg/model.py:532:silu`: the form in which sites of runs recorded in different checkouts or
/// on different machines compare equal. Sites that are not `FILE:LINE:FUNCTION` are unchanged.
pub(crate) fn short_site(site: &str) -> String {
    let (file, function) = site_parts(site);
    if file == site {
        return site.to_string();
    }
    let line = &site[file.len() + 1..site.len() - function.len() - 1];
    format!("{}:{line}:{function}", short_file(file))
}

/// The last two components of `file`'s path, `\` read as `/`.
pub(crate) fn short_file(file: &str) -> String {
    let file = file.replace('\\', "/");
    let parts: Vec<&str> = file.rsplitn(3, '/').collect();
    match parts.as_slice() {
        [name, dir, _] | [name, dir] => format!("{dir}/{name}"),
        _ => file.clone(),
    }
}

/// Every interned stack's site, computed once: the site of an event is one lookup.
#[derive(Clone, Debug, Default)]
pub struct SiteTable {
    /// The distinct sites, in order of first appearance.
    names: Vec<String>,
    /// Per [`FramesId`] (index 0: no frames), its site's index in `names`.
    of_stack: Vec<u32>,
    /// `names` by name.
    by_name: HashMap<String, u32>,
}

/// An index into a [`SiteTable`]'s sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteId(pub u32);

impl SiteTable {
    /// The sites of every stack of `frames`. With `depth` above 1, a stack's key is its `depth`
    /// innermost user frames (innermost first, joined by ` < `), where it has any; else its site.
    pub(crate) fn new(frames: &FrameTable, depth: usize) -> SiteTable {
        let mut t = SiteTable::default();
        let none = t.intern(NO_FRAMES);
        t.of_stack.push(none.0);
        for i in 1..=frames.len() as u32 {
            let stack = frames.get(FramesId(i));
            let key = match depth {
                0 | 1 => site_of(stack),
                k => {
                    let user: Vec<String> =
                        stack.iter().filter(|f| is_user(f)).take(k).map(describe).collect();
                    if user.is_empty() {
                        site_of(stack)
                    } else {
                        user.join(" < ")
                    }
                }
            };
            let id = t.intern(&key);
            t.of_stack.push(id.0);
        }
        t
    }

    /// The id of site `name`, added if new.
    pub(crate) fn intern(&mut self, name: &str) -> SiteId {
        if let Some(&id) = self.by_name.get(name) {
            return SiteId(id);
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.by_name.insert(name.to_string(), id);
        SiteId(id)
    }

    /// The site of stack `id` ([`NO_FRAMES`] for an unknown id).
    #[inline]
    pub(crate) fn of(&self, id: FramesId) -> SiteId {
        SiteId(self.of_stack.get(id.0 as usize).copied().unwrap_or(0))
    }

    /// The name of site `id`.
    pub(crate) fn name(&self, id: SiteId) -> &str {
        self.names.get(id.0 as usize).map_or(NO_FRAMES, String::as_str)
    }

    /// The number of distinct sites.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when there are no sites (never: [`NO_FRAMES`] is always one).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_written_out() {
        assert!(matches!(printable("model.py"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            printable("a\u{1b}[31m\u{7}\u{8}\r\n\t\0\u{9b}\u{fffe}z"),
            "a\\x1b[31m\\x07\\x08\\r\\n\\t\\0\\x9b\\u{fffe}z"
        );
        assert_eq!(printable("x\u{202e}y\u{2028}z\u{2066}"), "x\\u{202e}y\\u{2028}z\\u{2066}");
        let frame = f("a\nb.py", 3, "g\u{1b}");
        assert_eq!(describe(&frame), "a\\nb.py:3:g\\x1b");
    }

    fn f(filename: &str, line: u32, name: &str) -> Frame {
        Frame { filename: filename.into(), line, name: name.into() }
    }

    fn unwind() -> Frame {
        f("??", 0, "torch::unwind::unwind()")
    }

    #[test]
    fn the_site_is_the_innermost_user_frame() {
        let stack = [
            unwind(),
            f("CUDACachingAllocator.cpp", 0, "c10::cuda::...::malloc(...)"),
            f("/usr/lib/python3.12/site-packages/torch/nn/functional.py", 2910, "linear"),
            f("/croot/build/Python/bytecodes.c", 413, "_PyEval_EvalFrameDefault"),
            f("/home/me/model.py", 75, "forward"),
            f("/home/me/train.py", 12, "main"),
        ];
        assert_eq!(site_of(&stack), "/home/me/model.py:75:forward");
    }

    #[test]
    fn library_code_alone_gives_its_innermost_python_frame() {
        let stack = [
            unwind(),
            f("/opt/venv/lib/python3.11/site-packages/torch/optim/adamw.py", 411, "_multi_tensor"),
            f("/usr/lib/python3.11/threading.py", 982, "run"),
        ];
        assert_eq!(
            site_of(&stack),
            "/opt/venv/lib/python3.11/site-packages/torch/optim/adamw.py:411:_multi_tensor"
        );
        assert!(is_library("/usr/lib/python3.11/threading.py"));
        assert!(is_library("/x/lib/python3.13t/json/decoder.py"));
        assert!(is_library("/x/dist-packages/a.py"));
        assert!(!is_library("/home/me/lib/python_utils/a.py"));
        assert!(!is_library("/home/me/mylib/python3.1/a.py"), "not a path component");
    }

    #[test]
    fn cpp_only_stacks_name_the_autograd_node_then_the_aten_op() {
        let bmm = f(
            "??",
            0,
            "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)",
        );
        let op = f("??", 0, "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)");
        let redispatch = f("??", 0, "at::_ops::mm::redispatch(c10::DispatchKeySet)");
        assert_eq!(site_of(&[unwind(), op.clone(), bmm.clone()]), "backward:BmmBackward0");
        assert_eq!(site_of(&[unwind(), redispatch.clone(), op]), "op:bmm");
        assert_eq!(site_of(&[unwind(), redispatch]), NO_PYTHON_FRAME);
        assert_eq!(site_of(&[]), NO_FRAMES);
    }

    #[test]
    fn pseudo_files_are_python_frames() {
        let stack = [unwind(), f("<eval_with_key>.3", 7, "forward")];
        assert_eq!(site_of(&stack), "<eval_with_key>.3:7:forward");
        assert!(!is_python(&f("??", 0, "<lambda>")));
    }

    #[test]
    fn display_hides_what_memory_viz_hides_and_puts_the_user_first() {
        let stack = [
            unwind(),
            f("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
            f("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
            f("/x/aten/src/ATen/core/boxing/impl.h", 0, "call"),
            f("bytecodes.c", 413, "_PyEval_EvalFrameDefault"),
            f("/usr/local/src/Objects/call.c", 387, "PyCFunction_Call"),
            f("??", 0, "at::native::empty_cuda"),
            f("/home/me/model.py", 75, "forward"),
        ];
        assert_eq!(display(&stack), ["/home/me/model.py:75:forward", "at::native::empty_cuda"]);
    }

    #[test]
    fn windows_paths_and_short_sites() {
        assert!(is_library(r"C:\x\.venv\Lib\site-packages\torch\functional.py"));
        assert_eq!(
            short_site(r"C:\u\a2\cs336-basics\cs336_basics\model.py:532:silu"),
            "cs336_basics/model.py:532:silu"
        );
        assert_eq!(
            short_site("/home/n/a2/cs336_basics/model.py:532:silu"),
            "cs336_basics/model.py:532:silu"
        );
        assert_eq!(short_site("model.py:1:f"), "model.py:1:f");
        assert_eq!(short_site("backward:MmBackward0"), "backward:MmBackward0");
    }

    #[test]
    fn site_parts_split_file_and_function() {
        assert_eq!(site_parts("/a/b.py:75:forward"), ("/a/b.py", "forward"));
        assert_eq!(site_parts("C:/a/b.py:75:forward"), ("C:/a/b.py", "forward"));
        assert_eq!(
            site_parts("backward:BmmBackward0"),
            ("backward:BmmBackward0", "backward:BmmBackward0")
        );
    }

    #[test]
    fn the_table_names_each_stack_once_and_depth_joins_user_frames() {
        let mut frames = FrameTable::default();
        let a = frames.intern(vec![unwind(), f("/m.py", 1, "inner"), f("/m.py", 9, "outer")]);
        let b = frames.intern(vec![unwind(), f("/m.py", 1, "inner"), f("/t.py", 3, "main")]);
        let t = SiteTable::new(&frames, 1);
        assert_eq!(t.of(a), t.of(b), "the same innermost user frame");
        assert_eq!(t.name(t.of(a)), "/m.py:1:inner");
        assert_eq!(t.name(t.of(FramesId::NONE)), NO_FRAMES);
        let deep = SiteTable::new(&frames, 2);
        assert_ne!(deep.of(a), deep.of(b));
        assert_eq!(deep.name(deep.of(a)), "/m.py:1:inner < /m.py:9:outer");
    }
}
