"""OCR as a leaseq job: a document's pages go in, its text comes out.

::

    pip install 'leaseq[ocr]'
    leaseq worker --app leaseq.examples.ocr:registry --queue ocr

The job type ``ocr`` takes a document (see :mod:`leaseq.examples.pages` for the payload and
for rendering test pages). Pages are read one at a time, and after each page but the last
the text so far is checkpointed: an attempt that is reclaimed (its worker crashed or was
drained) resumes from the first unread page. A worker that is draining hands the job back
after the page in hand. The result, which is also the job's effect, holds the text of every
page, where it came from and the device that read it.

The model loads once per worker process, before its first claim (``on_startup``), on the
device ``OCR_DEVICE`` chooses (auto, cpu or cuda) with ``OCR_THREADS`` CPU threads per
inference (see :mod:`leaseq.examples.ocr_model`). This module uses only the public ``leaseq`` API.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from leaseq import Interrupted, JobContext, PermanentError, Registry
from leaseq.examples.ocr_model import (
    DEVICE_ENV,
    THREADS_ENV,
    OcrModel,
    available_providers,
    choose_device,
    choose_threads,
)

registry = Registry()
log = logging.getLogger("leaseq.examples.ocr")
MODEL: dict[str, OcrModel] = {}
# A page takes well under a second on one CPU core; no progress for this long means stuck.
PAGE_SECONDS = 120
MAX_PAGES = 500


@registry.on_startup
def load_model() -> None:
    """Load the OCR models once per process, on the configured device."""
    device = choose_device(os.environ.get(DEVICE_ENV, "auto"), available_providers())
    model = OcrModel.load(device, threads=choose_threads(os.environ.get(THREADS_ENV, "1")))
    MODEL["ocr"] = model
    log.info(
        "OCR model loaded on %s in %.2f s (providers %s)",
        device.value,
        model.load_seconds,
        ",".join(model.providers),
    )


@dataclass(frozen=True)
class Page:
    """One page of a document: image bytes to OCR, or text already extracted."""

    number: int
    image: bytes | None = None
    text: str | None = None


def _decode(number: int, field: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise PermanentError(f"page {number}: {field} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise PermanentError(f"page {number}: {field} is not valid base64 ({exc})") from exc


def parse_document(payload: Any) -> list[Page]:
    """The pages of a payload ``{"pages": [...]}``; PermanentError naming the first bad page
    (retrying cannot fix a bad document)."""
    raw = payload.get("pages") if isinstance(payload, dict) else None
    if not isinstance(raw, list) or not raw:
        raise PermanentError('payload must be {"pages": [page, ...]} with at least one page')
    if len(raw) > MAX_PAGES:
        raise PermanentError(f"document has {len(raw)} pages; the limit is {MAX_PAGES}")
    pages = []
    for number, page in enumerate(raw, start=1):
        if not isinstance(page, dict) or len(page.keys() & {"image", "text_layer"}) != 1:
            raise PermanentError(f'page {number}: must have exactly one of "image", "text_layer"')
        if "image" in page:
            pages.append(Page(number, image=_decode(number, "image", page["image"])))
            continue
        data = _decode(number, "text_layer", page["text_layer"])
        try:
            pages.append(Page(number, text=data.decode()))
        except UnicodeDecodeError as exc:
            raise PermanentError(f"page {number}: text_layer is not UTF-8 ({exc})") from exc
    return pages


def decode_image(page: Page) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The page's image as RGB pixels; PermanentError if it has none or it cannot be decoded."""
    if page.image is None:
        raise PermanentError(f"page {page.number}: has no image")
    try:
        with Image.open(io.BytesIO(page.image)) as opened:
            return np.asarray(opened.convert("RGB"))
    except UnidentifiedImageError as exc:
        reason = "not an image format Pillow reads"
        raise PermanentError(f"page {page.number}: image cannot be decoded ({reason})") from exc
    except (OSError, ValueError) as exc:
        raise PermanentError(f"page {page.number}: image cannot be decoded ({exc})") from exc


def read_page(model: OcrModel, page: Page) -> dict[str, Any]:
    """The page's text (lines joined by newlines), where it came from, and line count."""
    if page.image is None:
        text = page.text or ""
        return {
            "page": page.number,
            "source": "text_layer",
            "text": text,
            "lines": len(text.splitlines()),
        }
    [lines] = model.read([decode_image(page)])
    confidence = min((line.confidence for line in lines), default=None)
    return {
        "page": page.number,
        "source": "ocr",
        "text": "\n".join(line.text for line in lines),
        "lines": len(lines),
        "min_confidence": None if confidence is None else round(confidence, 4),
    }


def _resumed(checkpoint: Any, pages: Sequence[Page]) -> list[dict[str, Any]]:
    """The pages an earlier attempt finished, when its checkpoint fits this document."""
    done = checkpoint.get("pages") if isinstance(checkpoint, dict) else None
    if isinstance(done, list) and len(done) < len(pages):
        return [dict(page) for page in done if isinstance(page, dict)]
    return []


@registry.job("ocr", progress_timeout=PAGE_SECONDS)
def ocr(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Read every page of the document, checkpointing after each one."""
    model = MODEL["ocr"]
    pages = parse_document(payload)
    done = _resumed(ctx.last_checkpoint, pages)
    resumed_from = len(done)
    if resumed_from:
        ctx.log.info("resuming after page %d of %d", resumed_from, len(pages))
    for page in pages[resumed_from:]:
        ctx.raise_if_stopped()
        done.append(read_page(model, page))
        ctx.progress({"page": page.number, "of": len(pages)})
        if page.number == len(pages):
            break
        if not ctx.checkpoint({"pages": done}):
            raise Interrupted(f"lease lost after page {page.number}")
        if ctx.draining:
            raise Interrupted(f"worker draining: handed back after page {page.number}")
    return {
        "text": "\n\n".join(page["text"] for page in done),
        "pages": done,
        "resumed_from_page": resumed_from,
        "device": model.device.value,
    }
