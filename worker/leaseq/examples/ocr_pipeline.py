"""The OCR example as a pipeline: split a document, read its pages in parallel, merge them.

::

    pip install 'leaseq[ocr]'
    leaseq worker --app leaseq.examples.ocr_pipeline:registry --queue ocr

Enqueue one ``ocr.split`` job per document (the payload of :mod:`leaseq.examples.ocr`,
``{"pages": [...]}``). The split job checks the document and fans out, in the transaction of
its own completion (``ctx.spawn``): one ``ocr.page`` job per page, and one ``ocr.merge`` job
that waits for all of them. A crash can neither lose nor double that fan-out. Each page job
reads one page (a scanned image through the OCR model, or a text layer as it is) and any
worker may take it, so a long document is read by every worker at once. The merge job reads
its parents' results from the database, page by page (``ctx.parent_results()``: never copied
into a payload), and its result is the document's text, in page order.

If a page goes dead (a page that cannot be read), the merge is cancelled with the cause
recorded; retrying that page (``leaseq retry ID``) brings the merge back.

The OCR model loads lazily, once per process, the first time a page has an image (documents
made only of text layers never load it). ``OCR_PAGE_DELAY`` (seconds, default 0) slows page n
down by n times that, for demonstrations: a document's pages finish one after another. This
module uses only the public ``leaseq`` API.
"""

from __future__ import annotations

import base64
import os
import threading
from typing import Any

from leaseq import JobContext, PermanentError, Registry
from leaseq.examples import ocr

registry = Registry()
#: Page n waits n times this many seconds before it is read (demonstrations only).
DELAY_ENV = "OCR_PAGE_DELAY"
_loading = threading.Lock()


def _model() -> Any:
    with _loading:
        if "ocr" not in ocr.MODEL:
            ocr.load_model()
    return ocr.MODEL["ocr"]


@registry.job("ocr.split")
def split(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Fan out one page job per page and their merge (each page is checked by its own job: a
    bad page goes dead and cancels the merge, with the cause recorded)."""
    raw = payload.get("pages") if isinstance(payload, dict) else None
    if not isinstance(raw, list) or not raw:
        raise PermanentError('payload must be {"pages": [page, ...]} with at least one page')
    if len(raw) > ocr.MAX_PAGES:
        raise PermanentError(f"document has {len(raw)} pages; the limit is {ocr.MAX_PAGES}")
    reads = [
        ctx.spawn(
            ctx.queue,
            "ocr.page",
            {"number": n, "page": raw[n - 1]},
            name=f"page-{n}",
            max_attempts=2,
        )
        for n in range(1, len(raw) + 1)
    ]
    ctx.spawn(ctx.queue, "ocr.merge", {"pages": len(raw)}, name="merge", after=reads)
    return {"pages": len(raw)}


@registry.job("ocr.page", progress_timeout=ocr.PAGE_SECONDS)
def page(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Read one page: its text, where it came from, and its line count."""
    if not isinstance(payload, dict) or not isinstance(payload.get("number"), int):
        raise PermanentError('payload must be {"number": N, "page": {...}}')
    number = int(payload["number"])
    delay = float(os.environ.get(DELAY_ENV, "0") or 0) * number
    if delay and ctx.wait(delay):
        ctx.raise_if_stopped()
    [parsed] = ocr.parse_document({"pages": [payload["page"]]})
    if parsed.image is None:
        text = parsed.text or ""
        return {"page": number, "source": "text_layer", "text": text,
                "lines": len(text.splitlines())}  # fmt: skip
    result = ocr.read_page(_model(), ocr.Page(number, image=parsed.image))
    return {**result, "page": number}


@registry.job("ocr.merge")
def merge(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """The document's text from its pages' results, read by reference, in page order."""
    pages = sorted(
        (r.result for r in ctx.parent_results(page=200) if isinstance(r.result, dict)),
        key=lambda p: int(p["page"]),
    )
    if len(pages) != int(payload["pages"]):
        raise PermanentError(f"{len(pages)} page results for {payload['pages']} pages")
    return {
        "text": "\n\n".join(str(p["text"]) for p in pages),
        "pages": [{k: v for k, v in p.items() if k != "text"} for p in pages],
    }


def text_document(texts: list[str]) -> dict[str, Any]:
    """A document of born-digital pages (text layers) with these texts."""
    return {"pages": [{"text_layer": base64.b64encode(t.encode()).decode()} for t in texts]}
