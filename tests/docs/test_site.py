"""The documentation site builds in strict mode (`mkdocs build --strict`, as the README says):
a broken link or anchor, a page missing from the nav, a missing snippet or an API name
mkdocstrings cannot find fails the build. And a link broken on purpose does fail it, so the
first test cannot pass by checking nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[2]
# What the build reads: the config, the pages, the README sections they include, the hook and
# the benchmark report it serves (and the capacity tables it renders from the results), and
# the sources mkdocstrings reads the docstrings from.
INPUTS = [
    "mkdocs.yml",
    "README.md",
    "docs",
    "scripts/docs_hooks.py",
    "scripts/docs_roles.py",
    "sql/leaseq_sql/definitions/threat_model.toml",
    "bench/results",
    "bench/__init__.py",
    "bench/capacity_tables.py",
    "bench/results.py",
    "bench/stats.py",
]
SOURCES = ["worker", "operator"]


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )


def _copy_project(target: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in INPUTS + SOURCES:
        source, dest = ROOT / name, target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest, ignore=ignore)
        else:
            shutil.copy2(source, dest)
    return target


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    # The pages the README links to, the included report and its plots, the generated API.
    for page in (
        "index.html",
        "getting-started/index.html",
        "guides/kubernetes/index.html",
        "operations/alerts/index.html",
        "reference/cli/index.html",
        "benchmarks/report/index.html",
        "benchmarks/claim_efficiency.png",
    ):
        assert (site / page).is_file(), page
    started = (site / "getting-started/index.html").read_text()
    # The README's quickstart, included (code is highlighted: look for words, not the line).
    assert "Quickstart: your own job" in started and "hello:registry" in started
    assert "--8&lt;--" not in started and "[start:" not in started
    api = (site / "reference/api/index.html").read_text()
    assert "complete_many" in api and "Fenced" in api  # docstrings rendered
    # The docstrings' Sphinx roles are cross-references, not text (64 were printed as such).
    assert re.findall(r":(?:meth|class|func|data|attr|mod|exc|obj):", api) == []
    assert 'href="#leaseq.Queue.enqueue"><code>Queue.enqueue</code></a>' in api


def test_the_readme_links_only_pages_that_exist() -> None:
    """The README is read on its own (on a forge, in a checkout): its docs/ links must exist."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(targets) >= 15, targets
    missing = [t for t in targets if not (ROOT / t).is_file()]
    assert missing == []


@pytest.mark.parametrize(
    "broken",
    ["[a page](guides/no-such-page.md)", "[an anchor](design.md#no-such-anchor)"],
)
def test_a_broken_link_fails_the_build(tmp_path: Path, broken: str) -> None:
    project = _copy_project(tmp_path / "project")
    page = project / "docs" / "tests.md"
    page.write_text(page.read_text() + f"\n{broken}\n")
    done = _build(project, tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert broken.split("(")[1].rstrip(")") in output
    assert "strict mode" in output


def test_the_readme_says_which_extra_the_console_needs() -> None:
    """`leaseq console` refuses to start without the console extra; the README's console
    section says to install it."""
    section = (ROOT / "README.md").read_text().split("## The console", 1)[1].split("\n## ")[0]
    assert "pip install '.[console]'" in section
