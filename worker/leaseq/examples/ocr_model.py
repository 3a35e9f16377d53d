"""The OCR model of the example: PP-OCR text detection and recognition as ONNX models from
the ``rapidocr-onnxruntime`` wheel, run by onnxruntime on CPU or CUDA.

Pages are taken as upright (scans and rendered documents): PP-OCR's angle classifier, meant
for photos of rotated text, turned correct lines of clean pages upside down (2 of 120 lines
in our test pages), so it is not run. Recognition drops spaces now and then (the model is
trained mostly on Chinese text): compare texts without whitespace.

The device comes from the app's own variable ``OCR_DEVICE`` (not a worker setting):
``auto`` (the default) takes CUDA when this onnxruntime build offers ``CUDAExecutionProvider``
(the ``onnxruntime-gpu`` package) and the CPU otherwise; ``cuda`` refuses to start without
it, so a GPU pool never silently runs on CPU; ``cpu`` never touches a GPU.

``OCR_THREADS`` (default 1) is the CPU threads one inference uses. One thread per inference
and one worker slot per core is the setup that was fastest on this loaded 2-core machine:
onnxruntime's default (a thread per core of the node, not of the pod's CPU limit) makes
concurrent inferences fight over cores.

:meth:`OcrModel.read` reads several pages: detection runs per page (one image per model call:
pages differ in size), then recognition runs on the lines of every page together,
``lines_per_call`` lines per model call. Reading pages one at a time is ``read([page])``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime  # type: ignore[import-untyped]
from rapidocr_onnxruntime import RapidOCR  # type: ignore[import-untyped]

from leaseq import ConfigError

DEVICE_ENV = "OCR_DEVICE"
THREADS_ENV = "OCR_THREADS"
CUDA_PROVIDER = "CUDAExecutionProvider"
# Detection scales a page so its longer side is at most this many pixels (rapidocr's own
# default scales the shorter side up to 736 px: a wide page becomes ~3000 px, ~4x slower,
# with no better reading of printed text).
DETECT_MAX_SIDE = 960
MAX_BATCH = 64

Image = np.ndarray[Any, np.dtype[np.uint8]]


class Device(enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


def choose_device(setting: str, available: Sequence[str]) -> Device:
    """The device to run on (CPU or CUDA) for the ``OCR_DEVICE`` value ``setting``,
    given onnxruntime's available providers. ConfigError on an unknown value, or on ``cuda``
    when this onnxruntime build has no CUDA provider."""
    try:
        wanted = Device(setting.strip().lower())
    except ValueError as exc:
        choices = ", ".join(d.value for d in Device)
        raise ConfigError(f"{DEVICE_ENV}={setting!r}: must be one of {choices}") from exc
    has_cuda = CUDA_PROVIDER in available
    if wanted is Device.CUDA and not has_cuda:
        raise ConfigError(
            f"{DEVICE_ENV}=cuda, but onnxruntime offers only {', '.join(available)}: install "
            "onnxruntime-gpu (matching the node's CUDA) instead of onnxruntime"
        )
    if wanted is Device.AUTO:
        return Device.CUDA if has_cuda else Device.CPU
    return wanted


def available_providers() -> list[str]:
    return list(onnxruntime.get_available_providers())


def choose_threads(setting: str) -> int:
    """CPU threads per inference for the ``OCR_THREADS`` value ``setting`` (a positive
    integer); ConfigError otherwise."""
    try:
        threads = int(setting)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ConfigError(f"{THREADS_ENV}={setting!r}: must be a positive integer")
    return threads


@dataclass(frozen=True)
class Line:
    """One line of text as read, with the recogniser's confidence in [0, 1]."""

    text: str
    confidence: float


@dataclass(frozen=True)
class OcrModel:
    """The loaded models (load once per process: :meth:`load`), and what loading cost.
    Thread-safe: slots of one worker process share it (onnxruntime sessions are)."""

    engine: Any
    device: Device
    providers: list[str]
    load_seconds: float
    #: Text lines per recognition call by default: 1 on CPU, where bigger batches cost more
    #: CPU per line here (bench/ocr.py measures it); MAX_BATCH on CUDA (not measured here).
    lines_per_call: int

    @classmethod
    def load(cls, device: Device, *, threads: int = 1) -> OcrModel:
        """Load the three ONNX models on ``device`` (CPU or CUDA), each inference using
        ``threads`` CPU threads."""
        started = time.perf_counter()
        cuda = device is Device.CUDA
        engine = RapidOCR(
            det_use_cuda=cuda,
            rec_use_cuda=cuda,
            det_limit_type="max",
            det_limit_side_len=DETECT_MAX_SIDE,
            rec_batch_num=MAX_BATCH,
            intra_op_num_threads=threads,
        )
        providers = list(engine.text_rec.session.session.get_providers())
        if cuda and CUDA_PROVIDER not in providers:
            raise ConfigError(f"{DEVICE_ENV}=cuda, but the model session runs on {providers}")
        per_call = MAX_BATCH if cuda else 1
        return cls(engine, device, providers, time.perf_counter() - started, per_call)

    def lines_of(self, page: Image) -> list[Image]:
        """The text lines detected on one RGB page, cropped, in reading order."""
        engine = self.engine
        scaled, ratio_h, ratio_w = engine.preprocess(page)
        record = {"preprocess": {"ratio_h": ratio_h, "ratio_w": ratio_w}}
        padded, _ = engine.maybe_add_letterbox(scaled, record)
        boxes, _ = engine.auto_text_det(padded)
        if boxes is None:
            return []
        return list(engine.get_crop_img_list(padded, boxes))

    def recognize(self, lines: Sequence[Image], per_call: int | None = None) -> list[Line]:
        """Read cropped lines, ``per_call`` (default :attr:`lines_per_call`, at most
        MAX_BATCH) per model call; one :class:`Line` per input line, in order."""
        size = min(per_call or self.lines_per_call, MAX_BATCH)
        out = []
        for start in range(0, len(lines), size):
            read, _ = self.engine.text_rec(list(lines[start : start + size]))
            out += [Line(str(r[0]), float(r[1])) for r in read]
        return out

    def read(self, pages: Sequence[Image], lines_per_call: int | None = None) -> list[list[Line]]:
        """The lines of each page: detection per page, then recognition over the lines of
        all ``pages`` together, ``lines_per_call`` per model call. Low-confidence lines are
        dropped, as rapidocr does."""
        per_page = [self.lines_of(page) for page in pages]
        read = iter(self.recognize([line for lines in per_page for line in lines], lines_per_call))
        floor = float(self.engine.text_score)
        out = []
        for lines in per_page:
            page = [next(read) for _ in lines]
            out.append([line for line in page if line.confidence >= floor and line.text])
        return out
