"""Scenario 7: OCR inference in one process (leaseq.examples.ocr's model, PP-OCR on CPU):
pages per second read one page at a time vs micro-batched, and model load seconds.

What is batched, exactly: PP-OCR's text detection takes one image per model call (pages
differ in size), so detection always runs once per page. Recognition is what batches: an arm
``(pages, lines_per_call)`` reads ``pages`` pages per ``OcrModel.read`` call and sends their
text lines to the recognition model ``lines_per_call`` at a time (6 lines per test page, so
(1, 6) is one call per page, rapidocr's default batching; (4, 24) one call for four pages).

Pages are rendered once (PNG, decoded to pixels before timing); only the model is timed.
Arms are interleaved within each repeat so machine load hits them alike. One CPU thread per
inference (the example's default, OCR_THREADS=1); ``cpu_s_per_page`` is the process's CPU
time per page. Model load is the time to build the three ONNX sessions in a process that has
already imported onnxruntime (the first load of a run also warms the OS file cache).
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Context

NAME = "ocr"


def _pixels(pages: int) -> list[Any]:
    """``pages`` rendered test pages, decoded to RGB arrays."""
    from leaseq.examples import pages as render
    from leaseq.examples.ocr import decode_image, parse_document

    payload, _ = render.document("bench", pages)
    return [decode_image(page) for page in parse_document(payload)]


def read_rate(model: Any, images: list[Any], batch: int, per_call: int) -> dict[str, Any]:
    """Read every image, ``batch`` pages per read and ``per_call`` lines per recognition
    call; one CSV row."""
    wall, cpu = time.perf_counter(), time.process_time()
    lines = 0
    for start in range(0, len(images), batch):
        read = model.read(images[start : start + batch], per_call)
        lines += sum(len(page) for page in read)
    seconds = time.perf_counter() - wall
    cpu_seconds = time.process_time() - cpu
    return {
        "batch_pages": batch,
        "lines_per_call": per_call,
        "pages": len(images),
        "lines": lines,
        "seconds": round(seconds, 3),
        "pages_per_second": round(len(images) / seconds, 2),
        "cpu_s_per_page": round(cpu_seconds / len(images), 3),
    }


def run(ctx: Context) -> None:
    try:
        from leaseq.examples.ocr_model import Device, OcrModel
    except ImportError as exc:  # the ocr extra is not installed
        ctx.log(f"skipping {NAME}: {exc} (pip install 'leaseq[ocr]')")
        return
    arms = [(1, 1), (1, 6), (4, 24)] + ([] if ctx.quick else [(8, 48)])
    pages, repeats = (8, 2) if ctx.quick else (12, 3)
    images = _pixels(pages)
    loads, reads = [], []
    for repeat in range(1, repeats + 1):
        model = OcrModel.load(Device.CPU)
        loads.append({"repeat": repeat, "load_seconds": round(model.load_seconds, 3)})
        ctx.log(f"{NAME}: repeat {repeat}, model loaded in {model.load_seconds:.2f} s")
        model.read(images[:1])  # the first inference allocates and tunes: not a page rate
        for batch, per_call in arms:
            row = {"repeat": repeat, **read_rate(model, images, batch, per_call)}
            reads.append(row)
            ctx.log(f"{NAME}: {batch} pages, {per_call} lines/call: {row['pages_per_second']} p/s")
    recorder = ctx.recorder(NAME)
    recorder.params(
        {
            "pages": pages,
            "repeats": repeats,
            "arms": " ".join(f"{b}x{c}" for b, c in arms),
            "threads": 1,
        }
    )
    recorder.table("ocr_read", reads)
    recorder.table("ocr_load", loads)
