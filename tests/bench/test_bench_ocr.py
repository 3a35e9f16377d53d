"""Smoke test of the OCR benchmark (bench/ocr.py): one page per arm, a CSV row, and the
report's section. It checks that the pieces run, never how fast anything is."""

from __future__ import annotations

from pathlib import Path

from bench import ocr, report
from bench.context import Context
from bench.env import machine
from bench.results import read
from leaseq.examples.ocr_model import Device, OcrModel


def test_ocr_rates_are_recorded_and_reported(tmp_path: Path) -> None:
    model = OcrModel.load(Device.CPU)
    images = ocr._pixels(2)
    rows = [
        {"repeat": 1, **ocr.read_rate(model, images, batch, per_call)}
        for batch, per_call in [(1, 1), (2, 12)]
    ]
    assert [r["lines"] for r in rows] == [12, 12]  # 6 lines a page, both ways
    recorder = Context("", True, tmp_path, machine()).recorder(ocr.NAME)
    recorder.table("ocr_read", rows)
    recorder.table("ocr_load", [{"repeat": 1, "load_seconds": round(model.load_seconds, 3)}])
    assert [r["lines_per_call"] for r in read(tmp_path / "ocr_read.csv")] == ["1", "12"]
    text = report.generate(tmp_path).read_text()
    assert "OCR inference" in text
    assert "Model load (three ONNX sessions), seconds per repeat:" in text
