"""The example notebook runs from top to bottom against the installed package."""

from __future__ import annotations

from conftest import REPO, need


def test_the_example_notebook_executes():
    nbformat = need("nbformat")
    nbclient = need("nbclient")
    need("ipykernel")
    path = REPO / "examples" / "notebook.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("<svg" in h and "<table>" in h for h in html), "the replay shows a chart and table"
    # Each view the notebook shows: validate's verdict and counts, fit's grid, blame's bars,
    # diff's two runs, check's regressions and improvements apart.
    for view, marks in {
        "validate": ("allocations at the recorded address", " / "),
        "fit": ("✓", "least memory"),
        "blame": ("<svg", "live_bytes"),
        "diff": ("B − A", "<svg"),
        "check": ("Regressions (", "Improvements ("),
    }.items():
        assert any(f"fragsim {view}" in h and all(m in h for m in marks) for h in html), view
    out = REPO / "target" / "notebook.html"
    if out.parent.is_dir():
        # For a person to look at: every HTML output of the run, in one page.
        out.write_text("<html><meta charset='utf-8'><body>" + "<hr>".join(html) + "</body></html>")
