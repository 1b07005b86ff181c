"""`replay`, `explain`, `fit`, `blame` and `validate` ask the library's session directly, with
typed parameters: no command line between. Each answer, and each note, is still exactly what the
command prints."""

from __future__ import annotations

import json
import pickle

import fragsim
import pytest
from conftest import KINETO, SNAPSHOTS, TEXT_TRACE, cli, renamed, without_timings
from fragsim import _native


@pytest.fixture
def no_command_line(monkeypatch):
    """Fails any call that goes through the command line in this process."""

    def refused(*args, **kwargs):
        raise AssertionError(f"went through the command line: {args[0] if args else kwargs}")

    monkeypatch.setattr(_native, "call", refused)


def _command(*args: str):
    """The command's JSON and its notes (stderr's lines)."""
    done = cli(*args)
    return json.loads(done.stdout), [ln for ln in done.stderr.splitlines() if ln]


REPLAYS = [
    (TEXT_TRACE, {}, []),
    (TEXT_TRACE, {"policies": "all"}, ["-p", "all"]),
    (SNAPSHOTS[0], {"capacity": "6GiB"}, ["--capacity", "6GiB"]),
    (SNAPSHOTS[0], {"capacity": "none", "policies": ["pytorch", "bfc"]},
     ["--capacity", "none", "-p", "pytorch", "-p", "bfc"]),
    (SNAPSHOTS[1], {"empty_cache_every": 500, "empty_cache_at": [3, 40]},
     ["--empty-cache-every", "500", "--empty-cache-at", "3,40"]),
    (SNAPSHOTS[1], {"no_recorded_empty_cache": True}, ["--no-recorded-empty-cache"]),
    (SNAPSHOTS[2], {"outside": "1GiB", "capacity": 16 << 30},
     ["--outside", "1GiB", "--capacity", str(16 << 30)]),
    (SNAPSHOTS[2], {"policies": [{"expandable_segments": True}], "device": 0},
     ["-p", "pytorch:expandable_segments:True", "--device", "0"]),
    (KINETO, {"policies": ["pytorch", "pytorch-expandable"]},
     ["-p", "pytorch", "-p", "pytorch-expandable"]),
]


@pytest.mark.parametrize("trace,params,flags", REPLAYS, ids=lambda v: str(v)[-40:])
def test_replay_asks_the_session_and_answers_as_the_command(trace, params, flags,
                                                            no_command_line):
    want, notes = _command("replay", str(trace), *flags, "--json")
    got = fragsim.replay(str(trace), **params)
    assert without_timings(got) == without_timings(want)
    assert got.notes == notes
    loaded = fragsim.load(str(trace)).replay(**params)
    assert without_timings(loaded) == without_timings(want)


EXPLAINS = [
    (SNAPSHOTS[0], {}, []),
    (SNAPSHOTS[0], {"capacity": "6GiB"}, ["--capacity", "6GiB"]),
    (SNAPSHOTS[1], {"at": "peak", "policy": {"expandable_segments": True}},
     ["--at", "peak", "--policy", "pytorch:expandable_segments:True"]),
    (SNAPSHOTS[1], {"at": 100}, ["--at", "100"]),
    (KINETO, {}, []),
]


@pytest.mark.parametrize("trace,params,flags", EXPLAINS, ids=lambda v: str(v)[-40:])
def test_explain_asks_the_session_and_answers_as_the_command(trace, params, flags,
                                                             no_command_line):
    want, notes = _command("explain", str(trace), *flags, "--format", "json")
    got = fragsim.explain(str(trace), **params)
    assert without_timings(got) == without_timings(want)
    assert got.notes == notes


OTHERS = [
    ("fit", TEXT_TRACE, {}, ["--json"]),
    ("fit", SNAPSHOTS[1], {"policies": ["pytorch", "bfc"], "outside": "1GiB"},
     ["-p", "pytorch", "-p", "bfc", "--outside", "1GiB", "--json"]),
    ("blame", SNAPSHOTS[0], {}, ["--format", "json"]),
    ("blame", SNAPSHOTS[0], {"at": "peak-live", "by": "function", "top": 0, "depth": 2,
                             "policies": ["pytorch", "bfc"]},
     ["--at", "peak-live", "--by", "function", "--top", "0", "--depth", "2", "-p", "pytorch",
      "-p", "bfc", "--format", "json"]),
    ("blame", SNAPSHOTS[2], {"capacity": "6GiB", "at": "oom", "empty_cache_every": 1000},
     ["--capacity", "6GiB", "--at", "oom", "--empty-cache-every", "1000", "--format", "json"]),
    ("blame", KINETO, {"by": "size"}, ["--by", "size", "--format", "json"]),
    ("validate", SNAPSHOTS[0], {}, ["--json"]),
    ("validate", SNAPSHOTS[1], {"pytorch_version": "2.8", "policy": "pytorch-cuda",
                                "gpu_mem": "80GiB"},
     ["--pytorch-version", "2.8", "-p", "pytorch-cuda", "--gpu-mem", "80GiB", "--json"]),
]


@pytest.mark.parametrize("question,trace,params,flags", OTHERS, ids=lambda v: str(v)[-40:])
def test_fit_blame_and_validate_ask_the_session_and_answer_as_the_command(
    question, trace, params, flags, no_command_line
):
    done = cli(question, str(trace), *flags)
    want, notes = json.loads(done.stdout), [ln for ln in done.stderr.splitlines() if ln]
    got = getattr(fragsim, question)(str(trace), **params)
    assert without_timings(got) == without_timings(want)
    assert got.notes == notes
    assert got.exit_code == done.returncode == 0
    loaded = getattr(fragsim.load(str(trace)), question)(**params)
    assert without_timings(loaded) == without_timings(want)


@pytest.mark.parametrize("trace", [TEXT_TRACE, *SNAPSHOTS, KINETO], ids=lambda p: p.name)
def test_info_asks_the_library_and_answers_as_the_command(trace, no_command_line):
    want, notes = _command("info", str(trace), "--json")
    got = fragsim.info(str(trace))
    assert got == want and got.notes == notes
    assert fragsim.load(str(trace)).info == want


def test_a_snapshot_without_history_says_so(no_command_line, tmp_path):
    with open(SNAPSHOTS[0], "rb") as f:
        d = pickle.load(f)
    d["device_traces"] = [[] for _ in d["device_traces"]]
    for question in (fragsim.info, fragsim.replay, fragsim.fit):
        got = question(d)
        assert any("memory history was not recorded" in n for n in got.notes), question


DIFFS = [
    ((SNAPSHOTS[0],), {"policies": ["pytorch", "pytorch-expandable"]},
     ["-p", "pytorch", "-p", "pytorch-expandable"]),
    ((SNAPSHOTS[0], SNAPSHOTS[1]), {}, []),
    ((SNAPSHOTS[0], SNAPSHOTS[2]), {"policies": ["pytorch", "bfc"], "by": "file", "top": 0,
                                    "depth": 3},
     ["-p", "pytorch", "-p", "bfc", "--by", "file", "--top", "0", "--depth", "3"]),
    ((KINETO, KINETO), {"by": "size"}, ["--by", "size"]),
]


@pytest.mark.parametrize("traces,params,flags", DIFFS, ids=lambda v: str(v)[-40:])
def test_diff_asks_the_session_and_answers_as_the_command(traces, params, flags,
                                                          no_command_line):
    done = cli("diff", *map(str, traces), *flags, "--format", "json")
    want, notes = json.loads(done.stdout), [ln for ln in done.stderr.splitlines() if ln]
    got = fragsim.diff(*map(str, traces), **params)
    assert without_timings(got) == without_timings(want)
    assert got.notes == notes
    loaded = fragsim.load(str(traces[0])).diff(*map(str, traces[1:]), **params)
    assert without_timings(loaded) == without_timings(want)


def test_a_diff_of_two_dicts_names_each(no_command_line):
    dicts = []
    for path in SNAPSHOTS[:2]:
        with open(path, "rb") as f:
            dicts.append(pickle.load(f))
    got = fragsim.diff(*dicts)
    want, _ = _command("diff", *map(str, SNAPSHOTS[:2]), "--format", "json")
    want = renamed(renamed(want, str(SNAPSHOTS[0]), "<dict>"), str(SNAPSHOTS[1]), "<dict 2>")
    assert without_timings(got) == without_timings(want)
    assert (got["a"]["trace"], got["b"]["trace"]) == ("<dict>", "<dict 2>")


SWEEPS = [
    ((SNAPSHOTS[0],), {"policies": ["pytorch:max_split_size_mb:{64,256}"]},
     ["-p", "pytorch:max_split_size_mb:{64,256}"]),
    ((SNAPSHOTS[1],), {}, []),
    ((SNAPSHOTS[0], SNAPSHOTS[2]), {"policies": ["bfc", "pytorch:expandable_segments:True"],
                                    "capacity": "none", "objective": "fragmentation_at_peak"},
     ["-p", "bfc", "-p", "pytorch:expandable_segments:True", "--capacity", "none",
      "--objective", "fragmentation_at_peak"]),
    ((SNAPSHOTS[0], SNAPSHOTS[0]), {"policies": "bfc"}, ["-p", "bfc"]),
    ((KINETO,), {}, []),
]


@pytest.mark.parametrize("traces,params,flags", SWEEPS, ids=lambda v: str(v)[-40:])
def test_sweep_asks_the_sessions_and_answers_as_the_command(traces, params, flags,
                                                            no_command_line):
    done = cli("sweep", *map(str, traces), *flags, "--json")
    want, notes = json.loads(done.stdout), [ln for ln in done.stderr.splitlines() if ln]
    got = fragsim.sweep([str(t) for t in traces], **params)
    assert without_timings(got) == without_timings(want)
    assert got.notes == notes
    if len(traces) == 1:
        loaded = fragsim.load(str(traces[0])).sweep(**params)
        assert without_timings(loaded) == without_timings(want)


def test_a_sweep_of_dicts_names_each_and_reads_a_trace_given_twice_once(no_command_line):
    dicts = []
    for path in SNAPSHOTS[:2]:
        with open(path, "rb") as f:
            dicts.append(pickle.load(f))
    second = fragsim.load(dicts[1])
    got = fragsim.sweep([dicts[0], second, second], policies="bfc")
    assert got["traces"] == ["<dict>", "<dict 2>"]
    assert "fragsim: note: <dict 2> is named twice; it is read once" in got.notes
    want, _ = _command("sweep", *map(str, SNAPSHOTS[:2]), "-p", "bfc", "--json")
    want = renamed(renamed(want, str(SNAPSHOTS[0]), "<dict>"), str(SNAPSHOTS[1]), "<dict 2>")
    assert without_timings(got) == without_timings(want)


def test_check_asks_the_sessions_and_answers_as_the_command(tmp_path, no_command_line):
    traces = [str(SNAPSHOTS[0]), str(SNAPSHOTS[1]), str(KINETO)]
    baseline = tmp_path / "baseline.json"
    cli("check", *traces, "--baseline", str(baseline), "-p", "pytorch", "-p", "bfc", "--update")

    def same(flags, params, code):
        done = cli("check", *traces, "--baseline", str(baseline), *flags, "--json", expect=code)
        want, notes = json.loads(done.stdout), [ln for ln in done.stderr.splitlines() if ln]
        got = fragsim.check(traces, baseline=baseline, **params)
        assert without_timings(got) == without_timings(want), flags
        assert got.notes == notes and got.exit_code == code, flags
        return got

    same([], {}, 0)
    same(["-p", "bfc", "--tolerance", "0.5"], {"policies": "bfc", "tolerance": 0.5}, 0)
    # A baseline 10% better: a regression on every row, exit code 1.
    v = json.loads(baseline.read_text())
    for row in v["rows"]:
        row["peak_reserved_bytes"] = row["peak_reserved_bytes"] * 9 // 10
    baseline.write_text(json.dumps(v))
    got = same(["-p", "pytorch", "-p", "bfc"], {"policies": ["pytorch", "bfc"]}, 1)
    assert not got["ok"] and len(got["regressions"]) == 6
    done = cli("check", *traces, "--baseline", str(baseline), "--capacity", "8GiB", expect=2)
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.check(traces, baseline=baseline, capacity="8GiB")
    assert str(e.value) in done.stderr
    with pytest.raises(fragsim.TraceError, match="baseline"):
        fragsim.check(traces, baseline=tmp_path / "missing.json")
    (tmp_path / "bad.json").write_bytes(b"\x00garbage")
    with pytest.raises(fragsim.TraceError, match="not a JSON file fragsim wrote"):
        fragsim.check(traces, baseline=tmp_path / "bad.json")
    with pytest.raises(fragsim.UsageError, match="tolerance"):
        fragsim.check(traces, baseline=baseline, tolerance="lots")


def test_report_writes_what_the_command_writes(tmp_path, no_command_line):
    trace = str(SNAPSHOTS[1])
    flags = ["-p", "pytorch", "-p", "bfc", "--capacity", "4GiB"]
    done = cli("report", trace, "--out", str(tmp_path / "cli"), *flags)
    paths = fragsim.report(trace, out=tmp_path / "py", policies=["pytorch", "bfc"],
                           capacity="4GiB")
    cli_files = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert sorted(paths) == cli_files and "index.html" in paths
    got = json.loads(paths["results.json"].read_text())
    want = json.loads((tmp_path / "cli" / "results.json").read_text())
    assert without_timings(got) == without_timings(want)
    loaded = fragsim.load(trace).report(tmp_path / "loaded", policies=["pytorch", "bfc"],
                                        capacity="4GiB")
    assert sorted(loaded) == cli_files
    assert "wrote the report for 2 policies" in done.stderr
    with pytest.raises(fragsim.UsageError, match="segment_map_policy|nosuch"):
        fragsim.report(trace, out=tmp_path / "bad", segment_map_policy="nosuch")


@pytest.mark.parametrize("suffix", [".fst", ".txt", ".pickle", ".json", ".csv"])
def test_convert_writes_what_the_command_writes(tmp_path, suffix, capsys, no_command_line):
    for trace in (SNAPSHOTS[0], KINETO):
        done = cli("convert", str(trace), str(tmp_path / f"cli{suffix}"))
        capsys.readouterr()
        out = fragsim.convert(str(trace), tmp_path / f"py{suffix}", verbose=True)
        assert out.read_bytes() == (tmp_path / f"cli{suffix}").read_bytes(), (trace, suffix)
        # The notes (what the format loses) are the command's, naming its own output.
        said = capsys.readouterr().err
        assert said == done.stderr.replace(f"cli{suffix}", f"py{suffix}"), (trace, suffix)
        t = fragsim.load(str(trace))
        t.export(tmp_path / f"export{suffix}")
        assert (tmp_path / f"export{suffix}").read_bytes() == out.read_bytes()
    with pytest.raises(fragsim.UsageError, match="OUT"):
        fragsim.convert(str(SNAPSHOTS[0]), SNAPSHOTS[0])
    with pytest.raises(fragsim.UsageError):
        fragsim.convert(str(SNAPSHOTS[0]), tmp_path / "out.unknown")


def test_merge_joins_the_parts_as_the_command_does(tmp_path, no_command_line):
    trace, grid = str(SNAPSHOTS[0]), "pytorch:max_split_size_mb:{64,128,256}"
    for i in (1, 2):
        cli("sweep", trace, "-p", grid, "--shard", f"{i}/2", "--out", str(tmp_path / f"p{i}.json"))
    parts = [tmp_path / "p2.json", tmp_path / "p1.json", tmp_path / "p1.json"]
    done = cli("merge", *map(str, parts), "--json")
    got = fragsim.merge(parts)
    assert without_timings(got) == without_timings(json.loads(done.stdout))
    assert got.notes == [ln for ln in done.stderr.splitlines() if ln] and got.notes
    whole = fragsim.sweep(trace, policies=grid)
    assert without_timings(got) == without_timings(whole)
    with pytest.raises(fragsim.TraceError, match="sweep part"):
        fragsim.merge([tmp_path / "missing.json"])
    with pytest.raises(fragsim.UsageError, match="at least one"):
        fragsim.merge([])


def test_a_validation_that_differs_says_so_in_its_exit_code(no_command_line):
    flags = ["-p", "pytorch-npu", "--json"]
    done = cli("validate", str(SNAPSHOTS[1]), *flags, expect=1)
    got = fragsim.validate(str(SNAPSHOTS[1]), policy="pytorch-npu")
    assert got.exit_code == 1 and got["mismatches"]
    assert without_timings(got) == without_timings(json.loads(done.stdout))


def test_a_dict_is_asked_as_its_file(no_command_line):
    with open(SNAPSHOTS[0], "rb") as f:
        d = pickle.load(f)
    want, _ = _command("replay", str(SNAPSHOTS[0]), "--capacity", "6GiB", "--json")
    got = fragsim.replay(d, capacity="6GiB")
    assert without_timings(got) == renamed(without_timings(want), str(SNAPSHOTS[0]), "<dict>")
    want, _ = _command("explain", str(SNAPSHOTS[0]), "--format", "json")
    got = fragsim.explain(d)
    assert without_timings(got) == renamed(without_timings(want), str(SNAPSHOTS[0]), "<dict>")


def test_an_fst_path_streams_and_answers_as_the_command(tmp_path, no_command_line):
    fst = tmp_path / "a.fst"
    cli("convert", str(SNAPSHOTS[0]), str(fst))
    want, notes = _command("replay", str(fst), "-p", "all", "--json")
    got = fragsim.replay(str(fst), policies="all")
    assert without_timings(got) == without_timings(want)
    assert got.notes == notes


def test_a_bad_parameter_names_the_parameter(no_command_line):
    cases = [
        (lambda: fragsim.replay(str(TEXT_TRACE), capacity="40XB"), "capacity=40XB"),
        (lambda: fragsim.replay(str(TEXT_TRACE), outside="lots"), "outside=lots"),
        (lambda: fragsim.replay(str(TEXT_TRACE), empty_cache_every=0), "empty_cache_every=0"),
        (lambda: fragsim.replay(str(TEXT_TRACE), policies=["nosuch"]), "nosuch"),
        (lambda: fragsim.replay(str(TEXT_TRACE), device=7), "device 7"),
        (lambda: fragsim.explain(str(SNAPSHOTS[0]), at="peak-live"), "at=peak-live"),
        (lambda: fragsim.explain(str(SNAPSHOTS[0]), at="nowhere"), "at=nowhere"),
        (lambda: fragsim.explain(str(SNAPSHOTS[0]), policy="all"), "one"),
        (lambda: fragsim.fit(str(TEXT_TRACE), outside="-1"), "outside=-1"),
        (lambda: fragsim.blame(str(TEXT_TRACE), by="nonsense"), "by=nonsense is not valid"),
        (lambda: fragsim.blame(str(TEXT_TRACE), depth=0), "depth=0"),
        (lambda: fragsim.blame(str(TEXT_TRACE), at="nowhere"), "at=nowhere"),
        (lambda: fragsim.validate(str(SNAPSHOTS[0]), policy="bfc"), "policy=bfc"),
        (lambda: fragsim.validate(str(SNAPSHOTS[0]), pytorch_version="9.x"),
         "pytorch_version=9.x"),
        (lambda: fragsim.validate(str(SNAPSHOTS[0]), gpu_mem="big"), "gpu_mem=big"),
        (lambda: fragsim.validate(str(KINETO)), "validate needs a PyTorch memory snapshot"),
        (lambda: fragsim.diff(str(TEXT_TRACE)), "give policies=[X, Y], or a second trace"),
        (lambda: fragsim.diff(str(TEXT_TRACE), str(TEXT_TRACE), policies=["bfc"] * 3),
         "not 3"),
        (lambda: fragsim.diff(str(TEXT_TRACE), str(TEXT_TRACE), depth=0), "depth=0"),
        (lambda: fragsim.sweep(str(TEXT_TRACE), objective="nosuch_key"), "nosuch_key"),
        (lambda: fragsim.sweep(str(TEXT_TRACE), policies="pytorch:max_split_size_mb:{64"),
         "max_split_size_mb"),
        (lambda: fragsim.sweep(str(TEXT_TRACE), capacity="huge"), "capacity=huge"),
    ]
    for call, named in cases:
        with pytest.raises(fragsim.UsageError) as e:
            call()
        text = str(e.value)
        assert named in text, text
        assert "--" not in text and "Usage:" not in text, text


def test_a_bad_trace_is_named_with_its_place(no_command_line):
    data = SNAPSHOTS[0].read_bytes()
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.replay(data[: len(data) // 2])
    assert e.value.file == "<bytes>" and e.value.place.startswith("byte ")
    with pytest.raises(fragsim.TraceError) as e:
        fragsim.explain({"segments": 7})
    assert e.value.file == "<dict>" and "segments" in str(e.value)


def test_too_many_jobs_are_bounded_with_a_note(no_command_line):
    got = fragsim.replay(str(TEXT_TRACE), policies=["pytorch", "bfc"], jobs=1000)
    assert "fragsim: note: jobs=1000: running 2 at once (2 replays to run)" in got.notes
    want, _ = _command("replay", str(TEXT_TRACE), "-p", "pytorch", "-p", "bfc", "--json")
    assert without_timings(got) == without_timings(want)
