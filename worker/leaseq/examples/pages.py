"""Synthetic documents for the OCR example: pages rendered as PNG images from known text, so
the demo, the tests and the benchmark can check what the model read against what was drawn.

A document payload is ``{"pages": [page, ...]}`` where each page is either
``{"image": <base64 PNG/JPEG>}`` (a scan: it is OCRed) or ``{"text_layer": <base64 UTF-8>}``
(a born-digital page whose text was already extracted, e.g. from a PDF: it is taken as is).
Text layers travel base64-encoded because they may hold bytes a JSON payload in PostgreSQL
cannot (NUL).
"""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Sequence
from typing import Any

from PIL import Image, ImageDraw, ImageFont

# Plain words and three-digit numbers: what a correct read must give back exactly.
WORDS = tuple(
    [
        "invoice",
        "total",
        "amount",
        "paid",
        "due",
        "date",
        "customer",
        "order",
        "number",
        "tax",
        "rate",
        "net",
        "gross",
        "sum",
        "shipped",
        "received",
        "account",
        "balance",
        "credit",
        "debit",
        "payment",
        "terms",
        "reference",
        "water",
        "paper",
        "steel",
        "copper",
        "cement",
        "timber",
        "parts",
        "service",
        "hours",
        "freight",
        "express",
        "standard",
    ]
)
FONT_SIZE = 28
LINE_HEIGHT = 48
MARGIN = 32
PAGE_WIDTH = 900


def page_lines(seed: str, lines: int = 6, words: int = 5) -> list[str]:
    """Deterministic text lines for page ``seed`` (each line: words and one number)."""
    rng = random.Random(seed)
    return [
        " ".join([*rng.sample(WORDS, words), str(rng.randint(2, 9) * 100 + rng.randint(23, 98))])
        for _ in range(lines)
    ]


def render(lines: Sequence[str]) -> bytes:
    """A white page with ``lines`` in black, as PNG bytes."""
    font = ImageFont.load_default(size=FONT_SIZE)
    height = 2 * MARGIN + LINE_HEIGHT * max(len(lines), 1)
    image = Image.new("RGB", (PAGE_WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    for n, line in enumerate(lines):
        draw.text((MARGIN, MARGIN + n * LINE_HEIGHT), line, fill="black", font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def image_page(lines: Sequence[str]) -> dict[str, str]:
    """A scanned page showing ``lines``."""
    return {"image": base64.b64encode(render(lines)).decode()}


def text_layer_page(text: str) -> dict[str, str]:
    """A born-digital page whose extracted text is ``text`` (any characters, NUL included)."""
    return {"text_layer": base64.b64encode(text.encode()).decode()}


def document(name: str, pages: int, lines: int = 6) -> tuple[dict[str, Any], list[list[str]]]:
    """A payload of ``pages`` scanned pages, and the lines drawn on each."""
    drawn = [page_lines(f"{name}/{n}", lines) for n in range(pages)]
    return {"pages": [image_page(text) for text in drawn]}, drawn
