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

:meth:`OcrModel.read` reads several pages with one model call per stage over all their text
lines: detection runs per page (pages differ in size), then recognition runs on the lines of
every page together, in batches of up to ``batch`` lines. Reading pages one at a time is
``read([page])``.
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


@dataclass(frozen=True)
class Line:
    """One line of text as read, with the recogniser's confidence in [0, 1]."""

    text: str
    confidence: float


@dataclass(frozen=True)
class OcrModel:
    """The loaded models (load once per process: :meth:`load`), and what loading cost."""

    engine: Any
    device: Device
    providers: list[str]
    load_seconds: float

    @classmethod
    def load(cls, device: Device, *, batch: int = MAX_BATCH) -> OcrModel:
        """Load the three ONNX models on ``device`` (CPU or CUDA)."""
        started = time.perf_counter()
        cuda = device is Device.CUDA
        engine = RapidOCR(
            det_use_cuda=cuda,
            rec_use_cuda=cuda,
            det_limit_type="max",
            det_limit_side_len=DETECT_MAX_SIDE,
            rec_batch_num=batch,
        )
        providers = list(engine.text_rec.session.session.get_providers())
        if cuda and CUDA_PROVIDER not in providers:
            raise ConfigError(f"{DEVICE_ENV}=cuda, but the model session runs on {providers}")
        return cls(engine, device, providers, time.perf_counter() - started)

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

    def recognize(self, lines: Sequence[Image]) -> list[Line]:
        """Read cropped lines, up to the load's ``batch`` lines per model call; one
        :class:`Line` per input line, in order."""
        if not lines:
            return []
        read, _ = self.engine.text_rec(list(lines))
        return [Line(str(r[0]), float(r[1])) for r in read]

    def read(self, pages: Sequence[Image]) -> list[list[Line]]:
        """The lines of each page: detection per page, then one recognition pass over the
        lines of all ``pages`` together. Low-confidence lines are dropped, as rapidocr does."""
        per_page = [self.lines_of(page) for page in pages]
        read = iter(self.recognize([line for lines in per_page for line in lines]))
        floor = float(self.engine.text_score)
        out = []
        for lines in per_page:
            page = [next(read) for _ in lines]
            out.append([line for line in page if line.confidence >= floor and line.text])
        return out
