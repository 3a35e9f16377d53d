"""MkDocs hooks (mkdocs.yml `hooks:`): the benchmark report becomes pages of the site, the
security guide's threat-model table is rendered from the file the attack suite reads, and the
capacity page's tables from the committed capacity result (bench/results/capacity.csv).

`python -m bench report` writes bench/results/REPORT.md and its plots next to the CSV they come
from; rather than copy them into docs/, the build serves them as benchmarks/report.md and
benchmarks/*.png, so the report's relative image links work unchanged.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
THREAT_MODEL = ROOT / "sql" / "leaseq_sql" / "definitions" / "threat_model.toml"
MARKER = "<!-- threat-model -->"
COMPONENTS = ("worker", "operator", "producer", "console")
# The capacity page's two tables: measured, and the arithmetic on paper.
CAPACITY_MEASURED = "<!-- capacity: measured -->"
CAPACITY_PAPER = "<!-- capacity: paper -->"


def on_files(files: Files, config: Any) -> Files:
    """Add REPORT.md (as benchmarks/report.md) and every plot it shows."""
    sources = {"REPORT.md": "benchmarks/report.md"}
    sources.update({p.name: f"benchmarks/{p.name}" for p in sorted(RESULTS.glob("*.png"))})
    for name, uri in sources.items():
        files.append(File.generated(config, uri, abs_src_path=str(RESULTS / name)))
    return files


def threat_model_table(model: dict[str, Any]) -> str:
    """One row per relation: its row decision, then each role's privileges and rows."""
    head = "| relation | rows decided by | " + " | ".join(COMPONENTS) + " |"
    lines = [head, "|" + "---|" * (len(COMPONENTS) + 2)]
    for name, spec in sorted(model["relations"].items()):
        decision = "row level security" if spec.get("rls") else spec.get("decision", "")
        cells = []
        for c in COMPONENTS:
            if c not in spec:
                cells.append("-")
                continue
            privileges = ", ".join(spec[c]["privileges"])
            rows = spec[c].get("rows", "")
            cells.append(f"{privileges}: {rows}" if rows and rows != "-" else privileges)
        row = [f"`{name}`", decision, *cells]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
    functions = ", ".join(
        f"`{name}` ({', '.join(who) or 'owner only'})" for name, who in model["functions"].items()
    )
    return "\n".join(lines) + "\n\nFunctions, and who may execute them: " + functions + "."


def capacity_tables(markdown: str) -> str:
    """The capacity page with its markers replaced by the tables bench.capacity_tables renders
    from the committed result."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    from bench import capacity_tables

    markdown = markdown.replace(CAPACITY_MEASURED, capacity_tables.sizing_table(RESULTS))
    return markdown.replace(CAPACITY_PAPER, capacity_tables.paper_table(RESULTS))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Render the threat model and the capacity tables where their pages mark them."""
    if CAPACITY_MEASURED in markdown or CAPACITY_PAPER in markdown:
        markdown = capacity_tables(markdown)
    if MARKER not in markdown:
        return markdown
    table = threat_model_table(tomllib.loads(THREAT_MODEL.read_text()))
    return markdown.replace(MARKER, table)
