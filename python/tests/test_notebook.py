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
