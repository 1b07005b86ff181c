"""What a fragsim function returns: the object its command prints with ``--format json``, as a
``dict``, with conveniences for notebooks and data frames: tidy rows (:meth:`Result.rows`,
:meth:`Result.to_pandas`) and an HTML view per command (sizes in human units, tables that
scroll rather than run off the page, charts as inline SVG; every name from a trace escaped)."""

from __future__ import annotations

import html
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# The number a row's bar shows in the chart, by the first key the rows have.
_CHART_KEYS = (
    "peak_reserved_bytes",
    "min_capacity_bytes",
    "worst",
    "reserved_bytes",
    "peak_live_bytes",
    "live_bytes",
    "delta_bytes",
    "events",
)

Row = Dict[str, Any]


class Result(dict):  # type: ignore[type-arg]
    """The JSON object the command prints with ``--format json``, as a ``dict``.

    Equal to ``json.loads`` of the command line's output for the same options. Adds:
    ``command``, ``exit_code`` (1 when a check found a regression or a validation a mismatch),
    ``notes`` (what the command line would print on stderr), :meth:`rows`, :meth:`to_pandas`
    and an HTML view for notebooks.
    """

    def __init__(self, data: Dict[str, Any], command: str, exit_code: int = 0,
                 notes: Optional[List[str]] = None) -> None:
        super().__init__(data)
        self.command = command
        self.exit_code = exit_code
        self.notes = list(notes or [])

    def rows(self) -> List[Row]:
        """The result as tidy rows, each with a ``kind`` saying what it is: one per policy
        (``replay``: ``"policy"``, the ``sweep`` ranking: ``"spec"``), per policy and card
        (``fit``: ``"card"``), per site (``blame``, ``diff``, ``explain``: ``"site"``), per
        change (``check``: ``"regression"``/``"improvement"``), per mismatch (``validate``),
        per device (``info``). Sizes stay integers of bytes."""
        return _ROWS.get(self.command, _generic_rows)(self)

    def to_pandas(self) -> Any:
        """:meth:`rows` as a ``pandas.DataFrame`` (pandas is not a dependency: install it to
        use this)."""
        try:
            import pandas
        except ImportError as e:
            raise ImportError("Result.to_pandas() needs pandas: pip install pandas") from e
        return pandas.DataFrame(self.rows())

    def _repr_html_(self) -> str:
        title = html.escape(f"fragsim {self.command}" + _subject(self))
        view = _VIEWS.get(self.command, _generic_view)(self)
        notes = "".join(f"<p style='color:#666'>{html.escape(n)}</p>" for n in self.notes)
        return (f"<div class='fragsim' style='max-width:100%'><p><b>{title}</b></p>{view}"
                f"{notes}</div>")


# ---------------------------------------------------------------------------------------------
# Rows.


def _dicts(value: Any) -> List[Row]:
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _kinded(rows: Sequence[Row], kind: str, **extra: Any) -> List[Row]:
    return [{"kind": kind, **extra, **r} for r in rows]


def _replay_rows(r: Result) -> List[Row]:
    return _kinded(_dicts(r.get("results")), "policy")


def _fit_rows(r: Result) -> List[Row]:
    out: List[Row] = []
    for res in _dicts(r.get("results")):
        base = {k: v for k, v in res.items() if k != "cards"}
        for group in _dicts(res.get("cards")):
            named = _dicts(group.get("named")) or [group]
            for card in named:
                out.append({"kind": "card", **base, "card": card.get("card"),
                            "model": card.get("model"), "card_bytes": card.get("bytes"),
                            "fits": card.get("fits")})
        if not _dicts(res.get("cards")):
            out.append({"kind": "policy", **base})
    return out


def _sites_rows(r: Result) -> List[Row]:
    out: List[Row] = []
    for res in _dicts(r.get("results")):
        who = {"policy": res.get("policy"), "config": res.get("config")}
        out.extend(_kinded(_dicts(res.get("sites")), "site", **who))
    if not out:
        out = _kinded(_dicts(r.get("sites")), "site")
    return out


def _diff_rows(r: Result) -> List[Row]:
    """The site deltas (``kind`` ``"site"``), then the moved blocks (``kind`` ``"moved"``:
    from A's ``site`` to B's ``to_site``, the same bytes in both runs), as the CSV lists them."""
    moved = [{"site": m.get("from_site"), "to_site": m.get("to_site"), "a_bytes": m.get("bytes"),
              "b_bytes": m.get("bytes"), "delta_bytes": 0, "blocks": m.get("blocks")}
             for m in _dicts(r.get("moved"))]
    return _kinded(_dicts(r.get("sites")), "site") + _kinded(moved, "moved")


def _check_rows(r: Result) -> List[Row]:
    return (_kinded(_dicts(r.get("regressions")), "regression")
            + _kinded(_dicts(r.get("improvements")), "improvement"))


def _generic_rows(r: Result) -> List[Row]:
    for key, kind in (("results", "policy"), ("ranking", "spec"), ("devices", "device"),
                      ("mismatches", "mismatch"), ("sites", "site")):
        if _dicts(r.get(key)):
            return _kinded(_dicts(r.get(key)), kind)
    for key, value in r.items():
        if _dicts(value):
            return _kinded(_dicts(value), key)
    return []


_ROWS: Dict[str, Callable[[Result], List[Row]]] = {
    "replay": _replay_rows,
    "fit": _fit_rows,
    "sweep": lambda r: _kinded(_dicts(r.get("ranking")), "spec"),
    "merge": lambda r: _kinded(_dicts(r.get("ranking")), "spec"),
    "check": _check_rows,
    "validate": lambda r: _kinded(_dicts(r.get("mismatches")), "mismatch"),
    "info": lambda r: _kinded(_dicts(r.get("devices")), "device"),
    "blame": _sites_rows,
    "explain": lambda r: _sites_rows(r) or _generic_rows(r),
    "diff": _diff_rows,
}


# ---------------------------------------------------------------------------------------------
# Views.


def _subject(result: Dict[str, Any]) -> str:
    trace = result.get("trace")
    if isinstance(trace, str):
        device = result.get("device")
        return f": {trace}" + (f" (device {device})" if device is not None else "")
    traces = result.get("traces")
    if isinstance(traces, list):
        return f": {len(traces)} trace" + ("" if len(traces) == 1 else "s")
    return ""


def human_bytes(n: float) -> str:
    """``n`` bytes in binary units (``3.95 GiB``)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:,.0f} B"


def _is_bytes_key(key: str) -> bool:
    return key.endswith("_bytes") or key in ("worst", "bytes", "card_bytes")


def _cell(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "✓" if value else "✗"
    if isinstance(value, int) and _is_bytes_key(key):
        return f"<span title='{value} bytes'>{html.escape(human_bytes(value))}</span>"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return html.escape(", ".join(f"{k}: {v}" for k, v in value.items()))
    if isinstance(value, list):
        return html.escape(f"{len(value)} items")
    text = "" if value is None else str(value)
    if len(text) > 70:
        return f"<span title='{html.escape(text)}'>…{html.escape(text[-68:])}</span>"
    return html.escape(text)


def _table(rows: Sequence[Row], keys: Optional[Sequence[str]] = None) -> str:
    """An HTML table of ``rows`` (the given columns, else every scalar key), in a box that
    scrolls sideways rather than running off the page."""
    if not rows:
        return "<p>(none)</p>"
    if keys is None:
        found: List[str] = []
        for r in rows:
            found.extend(k for k, v in r.items()
                         if k not in found and not isinstance(v, (dict, list)))
        keys = found
    keys = [k for k in keys if any(k in r for r in rows)]
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(k, r.get(k))}</td>" for k in keys) + "</tr>" for r in rows
    )
    return (f"<div style='overflow-x:auto;max-width:100%'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def _label(row: Row) -> str:
    for key in ("spec", "policy", "site", "device", "trace"):
        if key in row and row[key] is not None:
            return str(row[key])
    return "?"


def _human(n: float, key: str) -> str:
    return human_bytes(n) if _is_bytes_key(key) else f"{n:,.0f}"


def chart_data(rows: List[Row]) -> Optional[Tuple[str, List[Tuple[str, float]]]]:
    """The key charted and one (label, value) per row, or ``None`` when no row has a number."""
    for key in _CHART_KEYS:
        bars = [(_label(r), float(r[key])) for r in rows
                if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        if bars:
            return key, bars
    return None


def bars_svg(key: str, bars: Sequence[Tuple[str, float]]) -> str:
    """A horizontal bar chart (inline SVG, no dependencies), one bar per (label, value); a
    negative value is drawn leftwards of the axis in another colour."""
    if not bars:
        return ""
    top = max((abs(v) for _, v in bars), default=0.0) or 1.0
    signed = any(v < 0 for _, v in bars)
    label_w, bar_w, row_h = 300, 300, 20
    axis = label_w + (bar_w / 2 if signed else 0)
    scale = bar_w / 2 if signed else bar_w
    height = row_h * len(bars) + 30
    width = label_w + bar_w + 110
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' style='max-width:100%;height:auto' "
        f"font-family='sans-serif' font-size='12'>",
        f"<text x='{label_w}' y='14' font-weight='bold'>{html.escape(key)}</text>",
    ]
    for i, (label, value) in enumerate(bars):
        y = 22 + i * row_h
        w = max(1.0, scale * abs(value) / top)
        x = axis - w if value < 0 else axis
        colour = "#e45756" if value < 0 else "#4c78a8"
        short = label if len(label) <= 44 else "…" + label[-43:]
        out.append(f"<text x='{label_w - 6}' y='{y + 13}' text-anchor='end'>"
                   f"<title>{html.escape(label)}</title>{html.escape(short)}</text>")
        out.append(f"<rect x='{x:.1f}' y='{y + 2}' width='{w:.1f}' height='{row_h - 6}' "
                   f"fill='{colour}'/>")
        tx = max(x + w, axis) + 4
        out.append(f"<text x='{tx:.1f}' y='{y + 13}'>{html.escape(_human(value, key))}</text>")
    out.append("</svg>")
    return "".join(out)


def peaks_svg(rows: List[Row]) -> str:
    """A horizontal bar chart of each row's peak (inline SVG); empty when there is nothing to
    chart."""
    data = chart_data(rows)
    return bars_svg(*data) if data else ""


_REPLAY_COLUMNS = (
    "policy", "config", "peak_reserved_bytes", "peak_allocated_bytes", "peak_requested_bytes",
    "fragmentation_at_peak", "reserved_at_end_bytes", "device_malloc_count", "alloc_retries",
    "oom", "first_oom_event",
)


def _replay_view(r: Result) -> str:
    rows = _dicts(r.get("results"))
    cap = _obj(r, "capacity")
    line = ""
    if cap and cap.get("bytes") is not None:
        how = " (inferred from the recording)" if cap.get("inferred") else ""
        line = f"<p>capacity {html.escape(human_bytes(cap['bytes']))}{html.escape(how)}</p>"
    return (bars_svg("peak_reserved_bytes",
                     [(_label(x), float(x.get("peak_reserved_bytes") or 0)) for x in rows])
            + line + _table(rows, _REPLAY_COLUMNS))


def _validate_view(r: Result) -> str:
    mismatches = _dicts(r.get("mismatches"))
    total, matched = r.get("allocs_total", 0), r.get("allocs_addr_matched", 0)
    seg_total = r.get("segment_events_recorded", 0)
    seg_matched = r.get("segment_events_matched", 0)
    ok = not mismatches and r.get("ok", True) is not False
    verdict = ("✓ the PyTorch model makes the recorded decisions" if ok
               else f"✗ {len(mismatches)} decision(s) differ from the recording")
    parts = [
        f"<p style='font-size:1.1em'><b>{html.escape(verdict)}</b></p><ul>",
        f"<li>allocations at the recorded address: {matched:,} / {total:,}</li>",
        f"<li>segment events matched: {seg_matched:,} / {seg_total:,}</li>",
    ]
    rec, sim = r.get("peak_reserved_recorded_bytes"), r.get("peak_reserved_simulated_bytes")
    if isinstance(rec, int) and isinstance(sim, int):
        parts.append(f"<li>peak reserved: recorded {html.escape(human_bytes(rec))}, simulated "
                     f"{html.escape(human_bytes(sim))}</li>")
    if r.get("undeterminable_events"):
        parts.append(f"<li>undeterminable events: {r['undeterminable_events']:,}</li>")
    parts.append("</ul>")
    if mismatches:
        parts.append(_table(mismatches))
    return "".join(parts)


def _fit_view(r: Result) -> str:
    results = _dicts(r.get("results"))
    cards: List[str] = []
    for res in results:
        for group in _dicts(res.get("cards")):
            for card in _dicts(group.get("named")) or [group]:
                name = str(card.get("card"))
                if name not in cards:
                    cards.append(name)
    head = "<th>policy</th><th>least memory</th>" + "".join(
        f"<th style='writing-mode:vertical-rl'>{html.escape(c)}</th>" for c in cards)
    body = []
    for res in results:
        fits: Dict[str, Any] = {}
        for group in _dicts(res.get("cards")):
            for card in _dicts(group.get("named")) or [group]:
                fits[str(card.get("card"))] = card.get("fits")
        least = res.get("min_capacity_bytes")
        cells = "".join(f"<td style='text-align:center'>{_mark(fits.get(c))}</td>"
                        for c in cards)
        body.append(f"<tr><td>{html.escape(_label(res))} {html.escape(str(res.get('config', '')))}"
                    f"</td><td>{_cell('min_capacity_bytes', least)}</td>{cells}</tr>")
    return (f"<div style='overflow-x:auto;max-width:100%'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _mark(fits: Any) -> str:
    if fits is True:
        return "<span style='color:#2a2'>✓</span>"
    if fits is False:
        return "<span style='color:#c22'>✗</span>"
    return ""


def _obj(r: Dict[str, Any], key: str) -> Dict[str, Any]:
    value = r.get(key)
    return value if isinstance(value, dict) else {}


def _check_view(r: Result) -> str:
    regressions, improvements = _dicts(r.get("regressions")), _dicts(r.get("improvements"))
    ok = r.get("ok", not regressions)
    verdict = "✓ no regression beyond the tolerance" if ok else (
        f"✗ {len(regressions)} regression(s) beyond the tolerance")
    return (f"<p><b>{html.escape(verdict)}</b></p>"
            f"<h4>Regressions ({len(regressions)})</h4>{_table(_in_units(regressions))}"
            f"<h4>Improvements ({len(improvements)})</h4>{_table(_in_units(improvements))}")


def _in_units(changes: Sequence[Row]) -> List[Row]:
    """A check's changes with the values of a byte metric in human units."""
    out = []
    for c in changes:
        if str(c.get("metric", "")).endswith("_bytes"):
            c = {k: human_bytes(v) if k in ("baseline", "now") and isinstance(v, (int, float))
                 else v for k, v in c.items()}
        out.append(c)
    return out


def _top_sites(sites: Sequence[Row], key: str, n: int = 10) -> List[Tuple[str, float]]:
    ranked = sorted(sites, key=lambda s: -abs(float(s.get(key) or 0)))[:n]
    return [(str(s.get("site")), float(s.get(key) or 0)) for s in ranked]


def _blame_view(r: Result) -> str:
    parts = []
    for res in _dicts(r.get("results")):
        who = f"{res.get('policy')} {res.get('config') or ''}".strip()
        moment = _obj(res, "moment")
        at = f" at {moment.get('kind')} (event {moment.get('event')})" if moment else ""
        totals = ", ".join(
            f"{k[:-6].replace('_', ' ')} {human_bytes(res[k])}"
            for k in ("reserved_bytes", "live_bytes", "rounding_bytes", "cached_free_bytes")
            if isinstance(res.get(k), int))
        parts.append(f"<h4>{html.escape(who + at)}</h4><p>{html.escape(totals)}</p>")
        sites = _dicts(res.get("sites"))
        parts.append(bars_svg("live_bytes", _top_sites(sites, "live_bytes")))
    if not parts:
        return _generic_view(r)
    return "".join(parts)


def _diff_view(r: Result) -> str:
    a, b, delta = _obj(r, "a"), _obj(r, "b"), _obj(r, "delta")
    keys = ("peak_reserved_bytes", "peak_allocated_bytes", "peak_live_bytes")
    rows = []
    for name, run in (("A", a), ("B", b)):
        rows.append({"run": name, "trace": run.get("trace"), "policy": run.get("policy"),
                     "config": run.get("config"), **{k: run.get(k) for k in keys}})
    rows.append({"run": "B − A", **{k: delta.get(k) for k in keys}})
    sites = _dicts(r.get("sites"))
    return (_table(rows, ("run", "trace", "policy", "config", *keys))
            + "<h4>Live bytes by site at each run's peak-live moment: B − A</h4>"
            + bars_svg("delta_bytes", _top_sites(sites, "delta_bytes"))
            + _table(sites[:20], ("site", "a_bytes", "b_bytes", "delta_bytes", "only_in"))
            + _moved_view(r))


def _moved_view(r: Result) -> str:
    moved = _dicts(r.get("moved"))
    if not moved:
        return ""
    return ("<h4>Moved: the same blocks, allocated at another site in B</h4>"
            + _table(moved[:20], ("from_site", "to_site", "bytes", "blocks")))


def _sweep_view(r: Result) -> str:
    ranking = _dicts(r.get("ranking"))
    best = _obj(r, "best")
    line = ""
    if best:
        env = best.get("env") or best.get("spec")
        line = f"<p>best: <code>{html.escape(str(env))}</code></p>"
    return line + peaks_svg(ranking[:20]) + _table(ranking)


def _generic_view(r: Result) -> str:
    rows = _generic_rows(r)
    scalars = {k: v for k, v in r.items() if not isinstance(v, (dict, list))}
    parts = []
    if scalars:
        parts.append(_table([scalars]))
    sites = [x for x in rows if x.get("kind") == "site"]
    if sites:
        key = next((k for k in ("live_bytes", "bytes", "delta_bytes") if k in sites[0]), None)
        if key:
            parts.append(bars_svg(key, _top_sites(sites, key)))
    elif rows:
        parts.append(peaks_svg(rows))
    if rows:
        parts.append(_table(rows))
    return "".join(parts) or "<p>(empty)</p>"


_VIEWS: Dict[str, Callable[[Result], str]] = {
    "replay": _replay_view,
    "validate": _validate_view,
    "fit": _fit_view,
    "check": _check_view,
    "blame": _blame_view,
    "explain": lambda r: _blame_view(r) if _dicts(r.get("results")) else _generic_view(r),
    "diff": _diff_view,
    "sweep": _sweep_view,
    "merge": _sweep_view,
}
