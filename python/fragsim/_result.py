"""What a fragsim function returns: the object its command prints with ``--format json``, as a
``dict``, with conveniences for notebooks and data frames."""

from __future__ import annotations

import html
from typing import Any, Dict, List, Optional, Tuple

# The list of rows each command's JSON holds: the table its output shows, one row per entry.
_ROWS = {
    "replay": ("results",),
    "fit": ("results",),
    "sweep": ("ranking",),
    "merge": ("ranking",),
    "check": ("regressions", "improvements"),
    "validate": ("mismatches",),
    "info": ("devices",),
    "blame": ("results",),
    "diff": ("sites",),
    "explain": ("fixes",),
}

# The number a row's bar shows in the chart, by the first key the rows have.
_CHART_KEYS = (
    "peak_reserved_bytes",
    "min_capacity_bytes",
    "worst",
    "reserved_bytes",
    "peak_live_bytes",
    "events",
)


class Result(dict):
    """The JSON object the command prints with ``--format json``, as a ``dict``.

    Equal to ``json.loads`` of the command line's output for the same options. Adds:
    ``command``, ``exit_code`` (1 when a check found a regression or a validation a mismatch),
    ``notes`` (what the command line would print on stderr), :meth:`rows`, :meth:`to_pandas`
    and an HTML view for notebooks (the table and a chart of the peaks, inline SVG).
    """

    def __init__(self, data: Dict[str, Any], command: str, exit_code: int = 0,
                 notes: Optional[List[str]] = None) -> None:
        super().__init__(data)
        self.command = command
        self.exit_code = exit_code
        self.notes = list(notes or [])

    def rows(self) -> List[Dict[str, Any]]:
        """The rows of the command's table: ``results`` of replay and fit, the ``ranking`` of a
        sweep, the ``regressions`` then ``improvements`` of a check, the ``mismatches`` of a
        validation, the ``devices`` of info."""
        rows: List[Dict[str, Any]] = []
        for key in _ROWS.get(self.command, ()):
            value = self.get(key)
            if isinstance(value, list):
                rows.extend(r for r in value if isinstance(r, dict))
        return rows

    def to_pandas(self):
        """The rows as a ``pandas.DataFrame`` (pandas is not a dependency: install it to use
        this)."""
        try:
            import pandas
        except ImportError as e:
            raise ImportError("Result.to_pandas() needs pandas: pip install pandas") from e
        return pandas.DataFrame(self.rows())

    def _repr_html_(self) -> str:
        rows = self.rows()
        title = html.escape(f"fragsim {self.command}" + _subject(self))
        parts = [f"<div class='fragsim'><p><b>{title}</b></p>"]
        chart = peaks_svg(rows)
        if chart:
            parts.append(chart)
        parts.append(_table(rows) if rows else "<p>(no rows)</p>")
        parts.append("</div>")
        return "\n".join(parts)


def _subject(result: Dict[str, Any]) -> str:
    trace = result.get("trace")
    if isinstance(trace, str):
        device = result.get("device")
        return f": {trace}" + (f" (device {device})" if device is not None else "")
    traces = result.get("traces")
    if isinstance(traces, list):
        return f": {len(traces)} trace" + ("" if len(traces) == 1 else "s")
    return ""


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return html.escape(str(value)[:80])
    return html.escape("" if value is None else str(value))


def _table(rows: List[Dict[str, Any]]) -> str:
    keys: List[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(k))}</td>" for k in keys) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _label(row: Dict[str, Any]) -> str:
    for key in ("spec", "policy", "site", "device", "trace"):
        if key in row and row[key] is not None:
            return str(row[key])
    return "?"


def _human(n: float, key: str) -> str:
    if not key.endswith("_bytes") and key != "worst":
        return f"{n:,.0f}"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:,.0f} B"


def chart_data(rows: List[Dict[str, Any]]) -> Optional[Tuple[str, List[Tuple[str, float]]]]:
    """The key charted and one (label, value) per row, or ``None`` when no row has a number."""
    for key in _CHART_KEYS:
        bars = [(_label(r), float(r[key])) for r in rows
                if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        if bars:
            return key, bars
    return None


def peaks_svg(rows: List[Dict[str, Any]]) -> str:
    """A horizontal bar chart of each row's peak (inline SVG, no dependencies); empty when there
    is nothing to chart."""
    data = chart_data(rows)
    if data is None:
        return ""
    key, bars = data
    top = max((v for _, v in bars), default=0.0) or 1.0
    label_w, bar_w, row_h = 260, 360, 20
    height = row_h * len(bars) + 30
    width = label_w + bar_w + 120
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"font-family='sans-serif' font-size='12'>",
        f"<text x='{label_w}' y='14' font-weight='bold'>{html.escape(key)}</text>",
    ]
    for i, (label, value) in enumerate(bars):
        y = 22 + i * row_h
        w = max(1.0, bar_w * value / top)
        out.append(f"<text x='{label_w - 6}' y='{y + 13}' text-anchor='end'>"
                   f"{html.escape(label[:40])}</text>")
        out.append(f"<rect x='{label_w}' y='{y + 2}' width='{w:.1f}' height='{row_h - 6}' "
                   f"fill='#4c78a8'/>")
        out.append(f"<text x='{label_w + w + 4:.1f}' y='{y + 13}'>"
                   f"{html.escape(_human(value, key))}</text>")
    out.append("</svg>")
    return "".join(out)
