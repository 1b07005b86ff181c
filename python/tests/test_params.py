"""Every flag of every command is a keyword of its function (docs/interface.md, "Python"), and a
bad value of any parameter is a `fragsim.UsageError` naming the parameter, in fragsim's words:
never a conversion error of the native module nor the command line's usage text."""

from __future__ import annotations

import inspect
import json
import re

import fragsim
import pytest
from conftest import SNAPSHOTS, TEXT_TRACE, cli, without_timings

#: Flags with no keyword, on purpose (docs/interface.md lists them): a function returns objects,
#: not printed text, and prints nothing unless `verbose=True`.
ABSENT = {"format", "json", "csv", "quiet", "help"}

COMMANDS = ["replay", "sweep", "fit", "check", "blame", "explain", "diff", "report", "validate",
            "info", "convert", "merge"]

#: The method of a loaded trace for each command that has one.
METHODS = {"replay": "replay", "sweep": "sweep", "fit": "fit", "check": "check",
           "blame": "blame", "explain": "explain", "diff": "diff", "report": "report",
           "validate": "validate", "convert": "export"}


def _flags(command: str) -> set:
    text = cli(command, "--help").stdout
    return {m.replace("-", "_") for m in re.findall(r"^\s+(?:-\w, )?--([a-z][a-z0-9-]*)", text,
                                                    re.M)}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_of_the_command_is_a_keyword(command):
    flags = _flags(command) - ABSENT
    assert flags, command
    params = set(inspect.signature(getattr(fragsim, command)).parameters)
    missing = {f for f in flags if f not in params and not (f == "policy" and "policies" in params)}
    assert not missing, f"fragsim.{command} lacks {sorted(missing)}"
    if command in METHODS:
        method = getattr(fragsim.load(str(TEXT_TRACE)), METHODS[command])
        params = set(inspect.signature(method).parameters)
        # A loaded trace is read once, by its first question: its methods take no read limit.
        flags -= {"max_input_size"}
        if command == "convert":
            flags.clear()
        missing = {f for f in flags
                   if f not in params and not (f == "policy" and "policies" in params)}
        assert not missing, f"Trace.{METHODS[command]} lacks {sorted(missing)}"


VERSIONED = [
    ("replay", TEXT_TRACE, {"pytorch_version": "2.3"}, ["--pytorch-version", "2.3", "--json"]),
    ("fit", TEXT_TRACE, {"policies": ["pytorch"], "pytorch_version": "2.3"},
     ["-p", "pytorch", "--pytorch-version", "2.3", "--json"]),
    ("blame", SNAPSHOTS[0], {"pytorch_version": "2.3"},
     ["--pytorch-version", "2.3", "--format", "json"]),
    ("explain", SNAPSHOTS[0], {"pytorch_version": "2.3"},
     ["--pytorch-version", "2.3", "--format", "json"]),
    ("explain", SNAPSHOTS[1], {"top": 3, "no_fixes": True, "empty_cache_every": 500,
                               "no_recorded_empty_cache": True, "jobs": 1},
     ["--top", "3", "--no-fixes", "--empty-cache-every", "500", "--no-recorded-empty-cache",
      "--jobs", "1", "--format", "json"]),
    ("explain", SNAPSHOTS[0], {"empty_cache_at": [3, 40], "max_input_size": "1GiB"},
     ["--empty-cache-at", "3,40", "--max-input-size", "1GiB", "--format", "json"]),
    ("sweep", TEXT_TRACE, {"policies": ["pytorch:max_split_size_mb:{64,256}"],
                           "pytorch_version": "2.3"},
     ["-p", "pytorch:max_split_size_mb:{64,256}", "--pytorch-version", "2.3", "--json"]),
    ("diff", TEXT_TRACE, {"pytorch_version": "2.3"},
     ["--pytorch-version", "2.3", "--format", "json"]),
]


@pytest.mark.parametrize("question,trace,params,flags", VERSIONED, ids=lambda v: str(v)[-40:])
def test_the_new_keywords_answer_as_their_flags(question, trace, params, flags):
    done = cli(question, str(trace), *flags)
    want = json.loads(done.stdout)
    got = getattr(fragsim, question)(str(trace), **params)
    assert without_timings(got) == without_timings(want)
    assert got.notes == [ln for ln in done.stderr.splitlines() if ln]
    if "max_input_size" not in params:
        loaded = getattr(fragsim.load(str(trace)), question)(**params)
        assert without_timings(loaded) == without_timings(want)


def test_check_and_report_take_pytorch_version(tmp_path):
    base = tmp_path / "base.json"
    cli("check", str(TEXT_TRACE), "--baseline", str(base), "--update", "--pytorch-version", "2.3")
    got = fragsim.check(str(TEXT_TRACE), baseline=base, pytorch_version="2.3")
    done = cli("check", str(TEXT_TRACE), "--baseline", str(base), "--pytorch-version", "2.3",
               "--json")
    assert without_timings(got) == without_timings(json.loads(done.stdout))
    assert got["ok"]
    paths = fragsim.report(str(TEXT_TRACE), out=tmp_path / "r", policies=["pytorch"],
                           pytorch_version="2.3")
    assert "index.html" in paths


_VERSIONED_FUNCTIONS = ["replay", "sweep", "fit", "blame", "explain", "diff", "report", "check"]


def _extra(name, tmp_path):
    return {"report": {"out": tmp_path / "r"},
            "check": {"baseline": tmp_path / "b.json"}}.get(name, {})


@pytest.mark.parametrize("name", _VERSIONED_FUNCTIONS)
def test_a_bad_pytorch_version_names_the_parameter(name, tmp_path):
    call = getattr(fragsim, name)
    with pytest.raises(fragsim.UsageError, match=r"^pytorch_version=9\.x: ") as e:
        call(str(TEXT_TRACE), pytorch_version="9.x", **_extra(name, tmp_path))
    assert "--" not in str(e.value)
    policies = {"policy": "bfc"} if name == "explain" else {"policies": ["bfc"]}
    with pytest.raises(fragsim.UsageError) as e:
        call(str(TEXT_TRACE), pytorch_version="2.3", **policies, **_extra(name, tmp_path))
    text = str(e.value)
    assert "pytorch_version" in text and "--" not in text and "-p " not in text, text


#: For each function, what it needs besides the bad value.
_NEEDS = {"check": lambda tmp: {"baseline": tmp / "b.json"},
          "report": lambda tmp: {"out": tmp / "r"}}

#: Each kind of bad value, with the functions that take the parameter and what the error says.
BAD = [
    ("top", -1, ["blame", "diff", "explain"], "top=-1: expected a count, 0 or more"),
    ("top", 2**70, ["blame", "diff", "explain"],
     f"top={2**70}: expected a count, at most {2**64 - 1}"),
    ("depth", -3, ["blame", "diff"], "depth=-3: expected a count, 0 or more"),
    ("jobs", -1, ["replay", "fit", "sweep", "check", "blame", "explain", "diff", "report"],
     "jobs=-1: expected a count, 0 or more"),
    ("empty_cache_at", [3, -1], ["replay", "blame", "explain", "report"],
     "empty_cache_at[1]=-1: expected an event index, 0 or more"),
    ("empty_cache_at", 5, ["replay", "blame", "explain", "report"],
     "empty_cache_at=5: expected a list of event indices"),
    ("empty_cache_every", 2**64, ["replay", "blame", "explain", "report"],
     f"empty_cache_every={2**64}: expected an event index, at most"),
    ("device", 2**40, ["replay", "validate", "fit", "sweep", "check", "blame", "diff",
                       "explain", "report"],
     f"device={2**40}: expected a device number, at most {2**31 - 1}"),
    ("device", "0", ["replay", "blame"], "device='0': expected a device number, not str"),
    ("no_recorded_empty_cache", "yes", ["replay", "blame", "explain", "report"],
     "no_recorded_empty_cache='yes': expected True or False"),
    ("by", 5, ["blame", "diff"], "by=5: expected a string, not int"),
    ("capacity", 1.5, ["replay", "sweep", "check", "blame", "explain", "report"],
     "capacity=1.5: expected an int of bytes or a string"),
    ("policies", [5], ["replay", "fit", "sweep", "check", "blame", "diff", "report"],
     "policies[0]=5: expected a policy spec string"),
    ("pytorch_version", 2.8, ["replay", "validate", "fit", "sweep", "check", "blame", "diff",
                              "explain", "report"],
     "pytorch_version=2.8: expected a string, not float"),
    ("baseline", b"x", ["check"], "baseline=b'x': expected a path (str or os.PathLike)"),
    ("max_input_size", [1], ["info", "replay", "convert", "merge"],
     "max_input_size=[1]: expected an int of bytes"),
]


def _cases():
    for param, value, names, says in BAD:
        for name in names:
            yield pytest.param(name, param, value, says, id=f"{name}-{param}={value!r}"[:60])


def _call(name, param, value, tmp_path):
    kwargs = {**_NEEDS.get(name, lambda tmp: {})(tmp_path), param: value}
    if name == "merge":
        return fragsim.merge([str(tmp_path / "p.json")], **kwargs)
    if name == "convert":
        return fragsim.convert(str(TEXT_TRACE), tmp_path / "t.fst", **kwargs)
    return getattr(fragsim, name)(str(TEXT_TRACE), **kwargs)


@pytest.mark.parametrize("name,param,value,says", list(_cases()))
def test_a_bad_value_is_a_usage_error_naming_the_parameter(name, param, value, says, tmp_path):
    with pytest.raises(fragsim.UsageError) as e:
        _call(name, param, value, tmp_path)
    text = str(e.value)
    assert text.startswith(says), text
    method = METHODS.get(name)
    if method and param != "max_input_size":
        t = fragsim.load(str(TEXT_TRACE))
        kwargs = {**_NEEDS.get(name, lambda tmp: {})(tmp_path), param: value}
        with pytest.raises(fragsim.UsageError) as e:
            getattr(t, method)(**kwargs)
        assert str(e.value).startswith(says), str(e.value)


@pytest.mark.parametrize("params", [
    {"top": -1}, {"jobs": -1}, {"empty_cache_at": [-1]}, {"device": 2**40},
], ids=str)
def test_the_command_line_paths_refuse_bad_values_alike(params, tmp_path):
    # blame with a flame graph, and replay with a file to export, run the command line.
    svg = tmp_path / "f.svg"
    if "top" not in params:
        with pytest.raises(fragsim.UsageError) as e:
            fragsim.replay(str(TEXT_TRACE), export_snapshot=tmp_path / "s.pickle", **params)
        assert "Overflow" not in str(e.value) and "--" not in str(e.value)
    with pytest.raises(fragsim.UsageError) as e:
        fragsim.blame(str(TEXT_TRACE), flamegraph=svg, **params)
    (param, value), = params.items()
    assert re.match(rf"{param}(\[\d+\])?=", str(e.value)), str(e.value)


def test_large_python_ints_are_taken_where_they_fit():
    got = fragsim.replay(str(TEXT_TRACE), policies=["pytorch", "bfc"], jobs=2**64 - 1,
                         empty_cache_every=2**63)
    assert any("running 2 at once" in n for n in got.notes), got.notes
    blamed = fragsim.blame(str(TEXT_TRACE), top=2**64 - 1)
    assert blamed.exit_code == 0


def test_a_shard_without_out_says_why_in_python_terms(tmp_path):
    for call in (lambda: fragsim.sweep(str(TEXT_TRACE), shard="1/2"),
                 lambda: fragsim.load(str(TEXT_TRACE)).sweep(shard="1/2")):
        with pytest.raises(fragsim.UsageError) as e:
            call()
        text = str(e.value)
        assert text.startswith("shard='1/2' needs out="), text
        assert "merge" in text and "<FILE>" not in text and "--" not in text, text
    got = fragsim.load(str(TEXT_TRACE)).sweep(policies=["pytorch"], shard="1/1",
                                             out=tmp_path / "p.json")
    assert got == {} and (tmp_path / "p.json").exists()
