"""MkDocs hooks (mkdocs.yml `hooks:`): the benchmark report becomes pages of the site.

`python -m bench report` writes bench/results/REPORT.md and its plots next to the CSV they come
from; rather than copy them into docs/, the build serves them as benchmarks/report.md and
benchmarks/*.png, so the report's relative image links work unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def on_files(files: Files, config: Any) -> Files:
    """Add REPORT.md (as benchmarks/report.md) and every plot it shows."""
    sources = {"REPORT.md": "benchmarks/report.md"}
    sources.update({p.name: f"benchmarks/{p.name}" for p in sorted(RESULTS.glob("*.png"))})
    for name, uri in sources.items():
        files.append(File.generated(config, uri, abs_src_path=str(RESULTS / name)))
    return files
