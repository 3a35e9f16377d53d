"""`docker build --target ocr`: the image with the OCR example reads a page with its real
model as the chart runs it (uid 10001, read-only root, no capabilities), and starts the OCR
worker by default. The default target stays the plain image (tests/image/test_image.py)."""

from __future__ import annotations

import json
import time

import pytest
from podmankit import MEASURED, PYTHON_VERSION, REPO, RUN_FLAGS, podman

pytestmark = pytest.mark.image

OCR_IMAGE = "localhost/leaseq:ocr-image-test"
READ_ONE_PAGE = """
import os
from leaseq.examples import pages
from leaseq.examples.ocr import decode_image, parse_document
from leaseq.examples.ocr_model import Device, OcrModel
model = OcrModel.load(Device.CPU)
payload, drawn = pages.document("image", 1)
[lines] = model.read([decode_image(page) for page in parse_document(payload)])
same = ["".join(l.text.split()) for l in lines] == ["".join(d.split()) for d in drawn[0]]
print("uid", os.getuid(), "read", same)
"""


@pytest.fixture(scope="module")
def ocr_image(image: str) -> str:
    """Built after the plain image (its builder stage is cached by then)."""
    started = time.monotonic()
    podman(
        "build",
        "--network=host",
        f"--build-arg=PYTHON_VERSION={PYTHON_VERSION}",
        "--target=ocr",
        "-t",
        OCR_IMAGE,
        str(REPO),
        timeout=1200,
    )
    MEASURED["ocr image build"] = f"{time.monotonic() - started:.1f} s"
    return OCR_IMAGE


def test_the_ocr_image_reads_a_page_as_a_pod_runs_it(ocr_image: str) -> None:
    out = podman("run", "--rm", *RUN_FLAGS, "--entrypoint=python", ocr_image, "-c", READ_ONE_PAGE)
    assert out.split() == ["uid", "10001", "read", "True"]


def test_the_ocr_image_runs_the_ocr_worker_by_default(ocr_image: str, image: str) -> None:
    ocr_config = json.loads(podman("image", "inspect", ocr_image))[0]["Config"]
    assert ocr_config["Entrypoint"] == ["leaseq"]
    assert ocr_config["Cmd"] == ["worker", "--app", "leaseq.examples.ocr:registry"]
    plain = json.loads(podman("image", "inspect", image))[0]["Config"]
    assert plain["Cmd"] == ["--help"]  # the default target is still the plain image
