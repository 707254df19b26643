"""The notebooks are committed without outputs, stay thin (import only swiftkv, analysis and the display stack) and
read their inputs under the results root. Executing them is bin/run-notebooks' job."""

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
ALLOWED = {"swiftkv", "analysis", "pandas", "matplotlib", "IPython", "os", "sys", "pathlib", "tempfile"}


def test_the_four_notebooks_exist():
    assert {p.stem for p in NOTEBOOKS} == {"simscore_explorer", "flops_calculator", "distill_curves", "results_browser"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_clean_and_thin(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and any(c["cell_type"] == "markdown" for c in nb["cells"])
    for cell in code:
        assert cell["outputs"] == [] and cell["execution_count"] is None, "commit notebooks with outputs cleared"
    source = "\n".join("".join(c["source"]) for c in code)
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported <= ALLOWED, f"imports outside swiftkv/analysis/display: {imported - ALLOWED}"
    assert 'ROOT = Path(os.environ.get("SWIFTKV_RESULTS_ROOT", "..")).resolve()' in source
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
