"""The Python package's documentation as the tests read it: docs/python.md (the index, the package's readme)
and the pages under docs/python/ it links. A test asks for a section by its heading, not for a file, so that
a section moving between pages does not move the test."""
import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def pages():
    """docs/python.md, then every page under docs/python/."""
    return [DOCS / "python.md", *sorted((DOCS / "python").glob("*.md"))]


def section(heading):
    """The text under the `## heading` line (up to the next heading of level 1 or 2) of the one page that holds
    it; an error when no page or more than one holds that heading."""
    line = re.compile(rf"^## {re.escape(heading)}$", re.M)
    found = [(page, match) for page in pages() for match in line.finditer(page.read_text())]
    assert len(found) == 1, f"## {heading}: in {[str(page.relative_to(DOCS)) for page, _ in found]}, not in one page"
    page, match = found[0]
    return re.split(r"\n#{1,2} ", page.read_text()[match.end():], maxsplit=1)[0]
