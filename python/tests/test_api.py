"""Every function against the installed command line, on every bundled snapshot; traces from
memory against their files; errors, output and notebook conveniences."""

from __future__ import annotations

import json
import os
import pickle
import time

import fragsim
import pytest
from conftest import (
    KINETO,
    SNAPSHOTS,
    TEXT_TRACE,
    cli,
    cli_json,
    need,
    renamed,
    without_timings,
)

POLICIES = ["pytorch", "pytorch-expandable", "bfc", "bound"]


def test_the_snapshots_are_there():
    assert len(SNAPSHOTS) >= 6, SNAPSHOTS


def test_version_runs_from_path():
    out = cli("--version").stdout
    assert out.strip() == f"fragsim {fragsim.__version__}"


def test_the_command_keeps_the_exit_codes():
    done = cli("replay", str(TEXT_TRACE), "--policy", "nosuch", expect=2)
    assert "nosuch" in done.stderr
    done = cli("info", "/nonexistent/trace.pickle", expect=2)
    assert done.stderr.startswith("fragsim: /nonexistent/trace.pickle")


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
def test_every_function_equals_the_command(snapshot, tmp_path):
    path = str(snapshot)
    policy_args = [a for p in POLICIES for a in ("--policy", p)]
    assert without_timings(fragsim.info(path)) == without_timings(cli_json("info", path))
    got = fragsim.replay(path, policies=POLICIES, jobs=1)
    assert without_timings(got) == without_timings(cli_json("replay", path, *policy_args))
    assert [r["policy"] for r in got["results"]].count("pytorch") == 1
    got = fragsim.replay(path, policies=["pytorch"], capacity="1GiB")
    want = cli_json("replay", path, "--policy", "pytorch", "--capacity", "1GiB")
    assert without_timings(got) == without_timings(want)
    got = fragsim.validate(path)
    want = cli_json("validate", path, expect=got.exit_code)
    assert without_timings(got) == without_timings(want)
    got = fragsim.fit(path, policies=["pytorch", "bound"])
    want = cli_json("fit", path, "--policy", "pytorch", "--policy", "bound")
    assert without_timings(got) == without_timings(want)
    spec = "pytorch:max_split_size_mb:{64,256}"
    got = fragsim.sweep([path], policies=[spec])
    assert without_timings(got) == without_timings(cli_json("sweep", path, "--policy", spec))
    assert got["best"]["env"] is None or got["best"]["env"].startswith("export ")


def test_sweep_shards_merge_into_the_sweep(tmp_path):
    traces = [str(SNAPSHOTS[0]), str(TEXT_TRACE)]
    spec = "pytorch:max_split_size_mb:{64,128,256}"
    parts = []
    for i in (1, 2):
        part = tmp_path / f"part{i}.json"
        fragsim.sweep(traces, policies=[spec], shard=f"{i}/2", out=part)
        parts.append(part)
    merged = fragsim.merge(parts)
    assert without_timings(merged) == without_timings(cli_json("merge", *map(str, parts)))
    assert without_timings(merged) == without_timings(fragsim.sweep(traces, policies=[spec]))


def test_check_passes_against_its_own_baseline_and_equals_the_command(tmp_path):
    baseline = tmp_path / "baseline.json"
    traces = [str(s) for s in SNAPSHOTS[:2]]
    fragsim.check(traces, baseline=baseline, update=True)
    assert baseline.exists()
    got = fragsim.check(traces, baseline=baseline)
    assert got["ok"] is True and got.exit_code == 0 and got["regressions"] == []
    assert got == cli_json("check", *traces, "--baseline", str(baseline))


def test_check_reports_a_regression_as_the_command_does(tmp_path):
    baseline = tmp_path / "baseline.json"
    trace = str(SNAPSHOTS[0])
    fragsim.check(trace, baseline=baseline, policies=["pytorch:expandable_segments:True"],
                  update=True)
    # The same recorded run under the default settings reserves more than with expandable
    # segments: a regression against that baseline.
    data = json.loads(baseline.read_text())
    text = json.dumps(data).replace("expandable_segments:True", "expandable_segments:False")
    baseline.write_text(text)
    got = fragsim.check(trace, baseline=baseline, policies=["pytorch:expandable_segments:False"])
    want = cli_json("check", trace, "--baseline", str(baseline), "--policy",
                    "pytorch:expandable_segments:False", expect=got.exit_code)
    assert got == want


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
def test_a_snapshot_dict_gives_what_its_file_gives(snapshot, tmp_path):
    with open(snapshot, "rb") as f:
        d = pickle.load(f)
    path = str(snapshot)
    for function, options in (
        (fragsim.info, {}),
        (fragsim.replay, {"policies": POLICIES}),
        (fragsim.validate, {}),
        (fragsim.replay, {"policies": ["pytorch"], "capacity": "1GiB"}),
    ):
        from_file = without_timings(function(path, **options))
        from_dict = without_timings(function(d, **options))
        assert from_dict.get("trace", "<dict>") == "<dict>"
        assert from_dict == renamed(from_file, path, "<dict>"), function.__name__
    # `convert` keeps every stack: the frames a dict's shared objects become (found by
    # identity) are the file's, byte for byte.
    for suffix in (".fst", ".pickle"):
        fragsim.convert(d, tmp_path / f"from-dict{suffix}")
        fragsim.convert(path, tmp_path / f"from-file{suffix}")
        got = (tmp_path / f"from-dict{suffix}").read_bytes()
        assert got == (tmp_path / f"from-file{suffix}").read_bytes(), suffix


def test_a_dict_that_refers_back_to_its_entries_reads_as_its_pickle_does(tmp_path):
    """A dict's trace entries go to the reader 1000 at a time and are then dropped, as a
    file's stream drops them; where a later object refers back to one (PyTorch's dicts never
    do), the dict is read whole instead, and answers as its pickle file does."""
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    entries = d["device_traces"][0]
    assert len(entries) > 2000, "entries in more than one batch"
    # After `device_traces`: an entry of the first batch, one of the last, and a frame list.
    d["later"] = [entries[0], entries[-1], entries[1500]["frames"]]
    path = tmp_path / "refers-back.pickle"
    path.write_bytes(pickle.dumps(d))
    for function, options in ((fragsim.info, {}), (fragsim.replay, {"policies": POLICIES})):
        from_file = without_timings(function(str(path), **options))
        from_dict = without_timings(function(d, **options))
        assert from_dict == renamed(from_file, str(path), "<dict>"), function.__name__
    fragsim.convert(d, tmp_path / "from-dict.fst")
    fragsim.convert(path, tmp_path / "from-file.fst")
    got = (tmp_path / "from-dict.fst").read_bytes()
    assert got == (tmp_path / "from-file.fst").read_bytes()


def test_an_error_in_a_later_batch_of_entries_names_its_key_path():
    """Entries dropped batch by batch keep their place in key paths and event indices."""
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    d["device_traces"][0][2345]["size"] = "large"
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.info(d)
    assert e.value.place == "device_traces[0][2345]"
    assert "trace entry 2345" in e.value.message and "pickle byte" not in str(e.value)
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    d["device_traces"][0][3456]["frames"] = [object()]
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.replay(d, policies=["pytorch"], capacity="1GiB")
    assert "device_traces[0][3456].frames[0]: expected a dict" in str(e.value)


def test_frames_lists_that_share_objects_keep_their_own_frames(tmp_path):
    """New lists holding the same frame dicts become one stack, and a list that differs in
    one object, or in its type, stays its own, as a file with the same content reads."""
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    entries = [e for e in d["device_traces"][0] if e.get("frames")][:4]
    base = entries[0]["frames"]
    entries[1]["frames"] = list(base)
    entries[2]["frames"] = tuple(base)
    entries[3]["frames"] = list(base[:-1]) + [dict(base[-1], line=base[-1]["line"] + 1)]
    fragsim.convert(d, tmp_path / "dict.pickle")
    data = pickle.dumps(d)
    fragsim.convert(data, tmp_path / "bytes.pickle")
    assert (tmp_path / "dict.pickle").read_bytes() == (tmp_path / "bytes.pickle").read_bytes()
    back = pickle.load(open(tmp_path / "dict.pickle", "rb"))
    frames = [e["frames"] for e in back["device_traces"][0] if e.get("frames")][:4]
    assert frames[0] == frames[1] == frames[2] != frames[3]
    assert frames[3][-1]["line"] == base[-1]["line"] + 1


def test_bytes_and_file_objects_give_what_the_file_gives():
    path = str(SNAPSHOTS[-1])
    want = without_timings(fragsim.replay(path, policies=POLICIES))
    data = open(path, "rb").read()
    got = without_timings(fragsim.replay(data, policies=POLICIES))
    assert got == renamed(want, path, "<bytes>")
    with open(path, "rb") as f:
        got = without_timings(fragsim.replay(f, policies=POLICIES))
    assert got == renamed(want, path, "<file>")
    kineto = without_timings(fragsim.info(KINETO.read_bytes()))
    assert kineto == renamed(without_timings(fragsim.info(str(KINETO))), str(KINETO), "<bytes>")


def test_several_traces_from_memory_keep_their_own_names():
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    got = fragsim.sweep([d, d], policies=["pytorch"])
    assert got["traces"] == ["<dict>", "<dict 2>"]


def test_a_settings_string_no_pytorch_accepts_is_located_in_the_dict_and_the_file(tmp_path):
    """A recorded ``PYTORCH_CUDA_ALLOC_CONF`` the model refuses names where it lies: the key
    path of the settings in a dict, their byte in the pickle file."""
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    d["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:abc"
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.replay(d)
    assert e.value.place == "allocator_settings", e.value
    assert "the recorded PYTORCH_CUDA_ALLOC_CONF: invalid value 'abc'" in e.value.message
    path = tmp_path / "bad-settings.pickle"
    path.write_bytes(pickle.dumps(d))
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.load(path).replay()
    assert e.value.file == str(path) and e.value.place.startswith("byte "), e.value


def test_a_wrong_shape_in_a_dict_names_its_key_path():
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    seg = next(i for i, s in enumerate(d["segments"]) if s["blocks"])
    d["segments"][seg]["blocks"][0]["size"] = "large"
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.replay(d)
    assert e.value.file == "<dict>"
    assert e.value.format == "pytorch-snapshot"
    assert e.value.place == f"segments[{seg}].blocks[0]"
    assert "'size' is a str, not an integer" in e.value.message
    assert isinstance(e.value, ValueError)
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    entries = d["device_traces"][0]
    entries[5]["addr"] = 1.5
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.info(d)
    assert e.value.place == "device_traces[0][5]"
    assert "trace entry 5" in e.value.message and "pickle byte" not in str(e.value)
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    d["segments"][seg]["blocks"][0]["state"] = object()
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.info(d)
    assert f"segments[{seg}].blocks[0].state: expected a dict" in str(e.value)
    # Frames are walked where the command keeps them (naming an OOM's stack).
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    d["device_traces"][0][5]["frames"] = [object()]
    fragsim.info(d)
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.replay(d, policies=["pytorch"], capacity="1GiB")
    assert "device_traces[0][5].frames[0]: expected a dict" in str(e.value)


def test_a_dict_that_holds_itself_is_an_error_not_a_hang():
    d = pickle.load(open(SNAPSHOTS[2], "rb"))
    d["device_traces"][0].append(d)
    with pytest.raises(fragsim.TraceError):
        fragsim.replay(d)


def test_a_dict_beyond_the_input_limit_is_refused():
    d = pickle.load(open(SNAPSHOTS[0], "rb"))
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.info(d, max_input_size="1MiB")
    assert "input limit" in str(e.value)


def test_errors_are_the_documented_exceptions(tmp_path):
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.info(str(tmp_path / "missing.pickle"))
    assert e.value.file == str(tmp_path / "missing.pickle")
    data = SNAPSHOTS[0].read_bytes()
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.replay(data[: len(data) // 2])
    assert e.value.file == "<bytes>" and e.value.format == "pytorch-snapshot"
    assert e.value.place is not None and e.value.place.startswith("byte ")
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.info(b"this is not a trace at all\x00\x01")
    assert e.value.file == "<bytes>"
    with pytest.raises(fragsim.UsageError) as e:
        fragsim.replay(str(TEXT_TRACE), policies=["nosuch"])
    assert "nosuch" in str(e.value)
    with pytest.raises(TypeError, match="no_such_option"):
        fragsim.replay(str(TEXT_TRACE), no_such_option=3)
    with pytest.raises(fragsim.UsageError):
        fragsim.replay(str(TEXT_TRACE), capacity="40")
    with pytest.raises(fragsim.UsageError):
        fragsim.replay(12345)


def test_nothing_reaches_stderr_unless_verbose(capfd):
    fragsim.replay(str(SNAPSHOTS[0]), policies=["pytorch"], capacity="1GiB")
    fragsim.sweep([str(SNAPSHOTS[0])], policies=["pytorch"])
    with pytest.raises(fragsim.UsageError):
        fragsim.replay(str(TEXT_TRACE), policies=["nosuch"])
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_notes_are_kept_and_printed_when_verbose(tmp_path, capsys):
    out = tmp_path / "t.csv"
    fragsim.convert(str(SNAPSHOTS[2]), out)
    assert capsys.readouterr().err == ""
    fragsim.convert(str(SNAPSHOTS[2]), out, verbose=True)
    assert "note:" in capsys.readouterr().err


def test_report_returns_the_paths_it_wrote(tmp_path):
    paths = fragsim.report(str(TEXT_TRACE), out=tmp_path / "r", policies=["pytorch", "bound"])
    assert paths["index.html"] == tmp_path / "r" / "index.html"
    assert paths["index.html"].exists() and "peaks.svg" in paths
    results = json.loads(paths["results.json"].read_text())
    assert [r["policy"] for r in results["results"]]


def test_convert_and_synth_return_their_output(tmp_path):
    out = fragsim.synth(tmp_path / "s.txt", layers=1, hidden=64, heads=2, steps=1)
    assert out.exists()
    fst = fragsim.convert(out, tmp_path / "s.fst")
    assert fragsim.info(fst)["format"] == "fst"


def test_results_show_a_table_and_a_chart():
    r = fragsim.replay(str(TEXT_TRACE), policies=POLICIES)
    assert isinstance(r, dict) and r.command == "replay" and r.exit_code == 0
    page = r._repr_html_()
    assert "<table>" in page and "<svg" in page
    for row in r["results"]:
        assert f">{row['policy']}<" in page


def test_to_pandas_gives_one_row_per_result():
    need("pandas")
    r = fragsim.replay(str(TEXT_TRACE), policies=POLICIES)
    frame = r.to_pandas()
    assert list(frame["policy"]) == [row["policy"] for row in r["results"]]
    want = [row["peak_reserved_bytes"] for row in r["results"]]
    assert list(frame["peak_reserved_bytes"]) == want


def test_converting_a_dict_against_reading_its_pickle():
    """Speed is shown, not asserted: the dict route against the file route, on every bundled
    snapshot, without stack frames (most commands) and with them (`convert`, `--capacity`);
    best of 5 each."""
    from fragsim import _native

    print()
    for snapshot in SNAPSHOTS:
        d = pickle.load(open(snapshot, "rb"))
        times = []
        for keep_frames in (False, True):
            dict_s = min(_native.convert_only(d, keep_frames) for _ in range(5))
            file_s = min(_native.convert_only(str(snapshot), keep_frames) for _ in range(5))
            assert dict_s > 0 and file_s > 0
            times.append(f"{dict_s * 1e3:.1f} ms vs {file_s * 1e3:.1f} ms")
        size = snapshot.stat().st_size
        print(f"{snapshot.name} ({size / 1e6:.1f} MB), dict converted vs pickle file read: "
              f"{times[0]} without frames, {times[1]} with frames")


def _command_threads() -> int:
    """The threads of this process named `fragsim-call`, or -1 where the system does not list
    threads (/proc): each command's thread, and the threads it starts (Linux names a thread
    after the one that started it), rayon's global pool among them once a command made it."""
    tasks = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(tasks):
        return -1
    count = 0
    for task in os.listdir(tasks):
        try:
            with open(f"{tasks}/{task}/comm") as f:
                count += f.read().strip() == "fragsim-call"
        except OSError:
            pass  # the thread ended while we looked
    return count


@pytest.fixture
def sigint_raises():
    """Python's own Ctrl-C handler for the test: a suite started as a background job of a
    non-interactive shell inherits SIGINT ignored, which Python keeps, so no KeyboardInterrupt
    would come."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_interrupts_a_long_command_and_stops_its_work(tmp_path, sigint_raises):
    """Ctrl-C raises KeyboardInterrupt in the caller, and the abandoned command's replays stop
    at their next look at the cancel flag instead of running on in the background: a minute or
    more of fitting here (a hundred policy specs, one at a time) ends within seconds."""
    import signal
    import threading

    trace = fragsim.synth(tmp_path / "long.fst", layers=24, steps=170, seq=1024,
                          vary_seq="256:1024")
    specs = [f"pytorch:max_split_size_mb:{64 + i}" for i in range(100)]
    # Threads that outlive every command (rayon's global pool, made by the first command that
    # uses it) are there before the long one starts.
    fragsim.replay(trace, policies=["pytorch", "bfc"])
    before = _command_threads()
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        fragsim.fit(trace, policies=specs, jobs=1)
    raised = time.monotonic()
    print(f"\nKeyboardInterrupt {raised - start - 1.0:.3f} s after SIGINT", end="")
    if before < 0:
        return
    while _command_threads() > before and time.monotonic() - raised < 30:
        time.sleep(0.01)
    assert _command_threads() <= before, "the interrupted command is still running"
    print(f", the command's thread ended {time.monotonic() - raised:.3f} s later")


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory):
    """A synthetic trace of about five million events: a second or more to convert to JSON, where
    the Ctrl-C below comes after 0.3 s."""
    path = tmp_path_factory.mktemp("long") / "long.fst"
    return fragsim.synth(path, layers=24, steps=1000, seq=1024, vary_seq="256:1024")


@pytest.fixture(scope="module")
def long_json(tmp_path_factory):
    """A Kineto JSON trace of about 870,000 events (150 MB): a second or more to read."""
    path = tmp_path_factory.mktemp("json")
    fst = fragsim.synth(path / "t.fst", layers=24, steps=170, seq=1024, vary_seq="256:1024")
    fragsim.convert(fst, path / "t.json")
    return path / "t.json"


@pytest.mark.parametrize("work", ["synth", "convert", "read"])
def test_ctrl_c_stops_synth_convert_and_reading(work, long_trace, long_json, tmp_path,
                                                 sigint_raises):
    """Ctrl-C stops the work of `synth`, `convert` and a trace read (here of a Kineto JSON file)
    as it stops replays: KeyboardInterrupt at once, the command's thread gone soon after, and no
    half-written output left behind."""
    import signal
    import threading

    out = tmp_path / "out.json"
    fragsim.info(str(long_trace))  # threads that outlive every command exist before
    before = _command_threads()
    run = {
        # Tens of millions of events: far more than a second of work.
        "synth": lambda: fragsim.synth(tmp_path / "huge.fst", layers=24, steps=5000, seq=1024),
        "convert": lambda: fragsim.convert(long_trace, out),
        "read": lambda: fragsim.info(str(long_json)),
    }[work]
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        run()
    raised = time.monotonic()
    print(f"\n{work}: KeyboardInterrupt {raised - start - 0.3:.3f} s after SIGINT", end="")
    if before < 0:
        return
    # Each of them looks at the flag every few milliseconds of work; left running, the read
    # and the conversion would take a second or more, synth far longer.
    while _command_threads() > before and time.monotonic() - raised < 0.5:
        time.sleep(0.01)
    assert _command_threads() <= before, f"the interrupted {work} is still running"
    print(f", the command's thread ended {time.monotonic() - raised:.3f} s later", end="")
    if work != "read":
        # The half-written output is removed as the abandoned work unwinds.
        while out.exists() and time.monotonic() - raised < 30:
            time.sleep(0.01)
        assert not (tmp_path / "huge.fst").exists() and not out.exists()


def test_ctrl_c_comes_through_while_a_snapshot_dict_is_read(sigint_raises):
    """A snapshot dict is read holding the GIL (its objects are Python's), but it lets the GIL go
    after each batch of trace entries: Ctrl-C raises KeyboardInterrupt within a batch, not once
    the whole dict is read, and the read stops there. Here a million entries take a third of a
    second or more to read; the Ctrl-C comes 0.05 s in."""
    import signal
    import threading

    from fragsim import _native

    frames = [{"filename": "train.py", "line": 1, "name": "step"}]
    entries = []
    for i in range(500_000):
        addr = 0x7F0000000000 + (i % 64) * 4096
        entries.append({"action": "alloc", "addr": addr, "size": 4096, "stream": 0,
                        "frames": frames})
        entries.append({"action": "free_completed", "addr": addr, "size": 4096, "stream": 0,
                        "frames": frames})
    snapshot = {"segments": [], "device_traces": [entries]}
    whole = _native.convert_only(snapshot)
    fragsim.info(snapshot)  # threads that outlive every command exist before
    before = _command_threads()
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        fragsim.info(snapshot)
    late = time.monotonic() - start - 0.05
    print(f"\nKeyboardInterrupt {late:.3f} s after SIGINT (the whole dict: {whole:.3f} s)", end="")
    # Held until the dict was read, it would come `whole - 0.05` s late.
    assert late < whole / 3, (late, whole)
    if before < 0:
        return
    raised = time.monotonic()
    while _command_threads() > before and time.monotonic() - raised < 0.5:
        time.sleep(0.01)
    assert _command_threads() <= before, "the interrupted read is still running"


@pytest.mark.parametrize("snapshot", SNAPSHOTS[:2], ids=lambda p: p.stem)
def test_blame_and_diff_equal_the_command_and_sum_exactly(snapshot):
    path = str(snapshot)
    got = fragsim.blame(path, policies=["pytorch"], at="peak-live", top=0)
    want = json.loads(cli("blame", path, "--policy", "pytorch", "--at", "peak-live", "--top",
                          "0", "--format", "json").stdout)
    assert without_timings(got) == without_timings(want)
    for run in got["results"]:
        assert sum(s["live_bytes"] for s in run["sites"]) == run["live_bytes"]
        assert (run["live_bytes"] + run["rounding_bytes"] + run["cached_free_bytes"]
                == run["reserved_bytes"])
    got = fragsim.diff(path, policies=["pytorch", "pytorch-expandable"], top=0)
    want = json.loads(cli("diff", path, "--policy", "pytorch", "--policy", "pytorch-expandable",
                          "--top", "0", "--format", "json").stdout)
    assert without_timings(got) == without_timings(want)
    assert sum(s["delta_bytes"] for s in got["sites"]) == got["delta"]["peak_live_bytes"]
