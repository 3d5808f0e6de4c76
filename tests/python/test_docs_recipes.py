"""The Python recipes of the documentation (docs/recipes/*.md) run as written.

Each recipe's ```python blocks are executed in order, in one namespace; the recipes assert
their own results against numpy's or the framework's. A recipe for a framework that is not
installed (torch, mlx) is skipped."""

import re
from pathlib import Path

import pytest

_RECIPES = Path(__file__).resolve().parents[2] / "docs" / "recipes"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_FRAMEWORKS = {"pytorch.md": "torch", "mlx.md": "mlx.core"}


# Wheel tests (cibuildwheel) run from a copy of tests/python, without docs/.
pytestmark = pytest.mark.skipif(not _RECIPES.is_dir(), reason="not run from a source tree")


def _recipes():
    return sorted(path for path in _RECIPES.glob("*.md") if _BLOCK.search(path.read_text()))


def test_every_python_recipe_is_collected():
    assert {path.name for path in _recipes()} >= {"numpy.md", "pytorch.md", "mlx.md"}


@pytest.mark.parametrize("recipe", _recipes(), ids=lambda path: path.name)
def test_recipe_runs(recipe):
    if recipe.name in _FRAMEWORKS:
        pytest.importorskip(_FRAMEWORKS[recipe.name], exc_type=ImportError)
    namespace = {"__name__": f"recipe_{recipe.stem}"}
    for number, block in enumerate(_BLOCK.findall(recipe.read_text(encoding="utf-8"))):
        exec(compile(block, f"{recipe.name}[block {number}]", "exec"), namespace)
