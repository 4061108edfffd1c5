"""The docs site builds strictly: a broken link, a missing anchor or a page out of the nav fails.

.ci/run builds it too (`uv run mkdocs build --strict`). mkdocs comes with `uv sync` (`docs` is a
default group); where it is missing the test skips with the command, and fails under CI.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def mkdocs_build(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` in `cwd`, with this environment's Python."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", *extra],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        reason = "MKDOCS NOT INSTALLED: run `uv sync` (docs is a default group) to build the docs"
        if UNDER_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    done = mkdocs_build(ROOT, "--site-dir", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr[-4000:]
    built = {
        p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("*.html")
    }
    for page in (ROOT / "docs").rglob("*.md"):
        name = page.relative_to(ROOT / "docs").with_suffix("").as_posix()
        assert ("index.html" if name == "index" else f"{name}/index.html") in built, name
    # The README is not part of the site, so mkdocs does not check its links into it: here.
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(docs/([\w-]+)\.md(?:#([\w-]+))?\)", readme)
    assert len(links) >= 10, links
    for page, anchor in links:
        html = tmp_path / "site" / ("index.html" if page == "index" else f"{page}/index.html")
        assert html.is_file(), page
        assert not anchor or f'id="{anchor}"' in html.read_text(), f"docs/{page}.md#{anchor}"


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The strict build can fail: the same configuration over a page with a dead anchor."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("MKDOCS NOT INSTALLED (see above)")
    docs = tmp_path / "docs"
    docs.mkdir()
    config = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[0]
    (tmp_path / "mkdocs.yml").write_text(config + "\nnav:\n  - Home: index.md\n")
    (docs / "index.md").write_text("# Home\n\nSee [nowhere](#no-such-heading).\n")
    done = mkdocs_build(tmp_path)
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr
