"""The OCR example's pieces in one process: device choice, document parsing, and the model
reading rendered pages (batched across pages exactly as one page at a time)."""

from __future__ import annotations

import base64

import pytest

import leaseq
from leaseq.examples import pages
from leaseq.examples.ocr import decode_image, parse_document, read_page
from leaseq.examples.ocr_model import Device, OcrModel, choose_device, choose_threads

CPU_ONLY = ["AzureExecutionProvider", "CPUExecutionProvider"]
WITH_CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("setting", "available", "device"),
    [
        ("auto", CPU_ONLY, Device.CPU),
        ("auto", WITH_CUDA, Device.CUDA),
        (" CUDA ", WITH_CUDA, Device.CUDA),
        ("cpu", WITH_CUDA, Device.CPU),
        ("cpu", CPU_ONLY, Device.CPU),
    ],
)
def test_device_follows_the_setting_and_what_onnxruntime_offers(
    setting: str, available: list[str], device: Device
) -> None:
    assert choose_device(setting, available) is device


def test_cuda_without_a_cuda_build_refuses_to_start() -> None:
    with pytest.raises(leaseq.ConfigError, match=r"OCR_DEVICE=cuda.*onnxruntime-gpu"):
        choose_device("cuda", CPU_ONLY)


@pytest.mark.parametrize(("setting", "threads"), [("1", 1), ("4", 4)])
def test_threads_setting(setting: str, threads: int) -> None:
    assert choose_threads(setting) == threads


@pytest.mark.parametrize("setting", ["0", "-2", "two", ""])
def test_bad_threads_setting_is_named(setting: str) -> None:
    with pytest.raises(leaseq.ConfigError, match=r"OCR_THREADS=.*positive integer"):
        choose_threads(setting)


def test_unknown_device_is_named() -> None:
    with pytest.raises(leaseq.ConfigError, match=r"OCR_DEVICE='tpu'.*auto, cpu, cuda"):
        choose_device("tpu", WITH_CUDA)


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (None, "payload must be"),
        ({"pages": []}, "at least one page"),
        ({"pages": [{"image": "x", "text_layer": "y"}]}, "page 1: must have exactly one"),
        ({"pages": [pages.text_layer_page("a"), {"image": "%%%"}]}, "page 2: image is not"),
        ({"pages": [{"text_layer": base64.b64encode(b"\xff").decode()}]}, "not UTF-8"),
        ({"pages": [{"image": 7}]}, "page 1: image must be a base64 string"),
    ],
)
def test_bad_documents_are_permanent_errors_naming_the_page(payload: object, error: str) -> None:
    with pytest.raises(leaseq.PermanentError, match=error):
        parse_document(payload)


def test_text_layers_keep_every_character() -> None:
    [page] = parse_document({"pages": [pages.text_layer_page("a\x00b\tc\u00e9")]})
    assert page.text == "a\x00b\tc\u00e9"


@pytest.fixture(scope="module")
def model() -> OcrModel:
    return OcrModel.load(Device.CPU)


def squeeze(text: str) -> str:
    """The model drops spaces now and then (see leaseq.examples.ocr_model)."""
    return "".join(text.split())


def test_model_reads_rendered_pages_batched_or_not(model: OcrModel) -> None:
    payload, drawn = pages.document("unit", 3)
    images = [decode_image(p) for p in parse_document(payload)]
    expected = [[squeeze(line) for line in lines] for lines in drawn]
    batched = model.read(images, lines_per_call=64)  # one recognition call for 3 pages
    one_by_one = [model.read([image])[0] for image in images]  # one line per call on CPU
    # Batching pads lines to the widest of the call, which moves spaces, never letters.
    for read in (batched, one_by_one):
        assert [[squeeze(line.text) for line in page] for page in read] == expected
    # rapidocr's own pipeline (without the angle classifier) batches a page's lines in one
    # call: it reads exactly what read() does with the same batching.
    own, _ = model.engine(images[0], use_cls=False)
    [same] = model.read(images[:1], lines_per_call=64)
    assert [row[1] for row in own] == [line.text for line in same]


def test_a_page_without_text_reads_as_empty(model: OcrModel) -> None:
    [page] = parse_document({"pages": [pages.image_page([])]})
    assert read_page(model, page)["text"] == ""


def test_an_undecodable_image_is_a_permanent_error(model: OcrModel) -> None:
    [page] = parse_document({"pages": [{"image": base64.b64encode(b"not a png").decode()}]})
    with pytest.raises(leaseq.PermanentError, match="page 1: image cannot be decoded"):
        read_page(model, page)
