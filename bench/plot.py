"""A tiny PNG line-chart writer for the benchmark report (no plotting package needed).

Sits at the end of ``bench/run.py``: figures in, ``bench/plots/*.png`` out. Draws axes with
decade (log) or even (linear) ticks, one coloured polyline with point markers per series, and a
legend, using a 3x5 bitmap font. It writes files only; it measures nothing.
"""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

Color = tuple[int, int, int]
PALETTE: tuple[Color, ...] = (
    (220, 50, 32),
    (0, 90, 181),
    (26, 133, 55),
    (230, 140, 0),
    (120, 60, 170),
    (90, 90, 90),
    (0, 160, 170),
)
_GLYPHS = {
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001001001001",
    "8": "111101111101111",
    "9": "111101111001111",
    "A": "010101111101101",
    "B": "110101110101110",
    "C": "011100100100011",
    "D": "110101101101110",
    "E": "111100110100111",
    "F": "111100110100100",
    "G": "011100101101011",
    "H": "101101111101101",
    "I": "111010010010111",
    "J": "001001001101010",
    "K": "101101110101101",
    "L": "100100100100111",
    "M": "101111111101101",
    "N": "110101101101101",
    "O": "010101101101010",
    "P": "110101110100100",
    "Q": "010101101110011",
    "R": "110101110101101",
    "S": "011100010001110",
    "T": "111010010010010",
    "U": "101101101101111",
    "V": "101101101101010",
    "W": "101101111111101",
    "X": "101101010101101",
    "Y": "101101010010010",
    "Z": "111001010100111",
    ".": "000000000000010",
    "-": "000000111000000",
    "/": "001001010100100",
    "(": "010100100100010",
    ")": "010001001001010",
    ":": "000010000010000",
    "%": "101001010100101",
    "_": "000000000000111",
    " ": "000000000000000",
    "=": "000111000111000",
    ",": "000000000010100",
    "<": "001010100010001",
    ">": "100010001010100",
    "+": "000010111010000",
}


class Canvas:
    """An RGB image with pixel, line, rectangle and text drawing."""

    def __init__(self, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.px = bytearray(b"\xff" * (width * height * 3))

    def set(self, x: int, y: int, c: Color) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i : i + 3] = bytes(c)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: Color) -> None:
        for y in range(min(y0, y1), max(y0, y1) + 1):
            for x in range(min(x0, x1), max(x0, x1) + 1):
                self.set(x, y, c)

    def line(self, x0: int, y0: int, x1: int, y1: int, c: Color, width: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        r = width // 2
        for s in range(steps + 1):
            x = round(x0 + (x1 - x0) * s / steps)
            y = round(y0 + (y1 - y0) * s / steps)
            self.rect(x - r, y - r, x + r, y + r, c)

    def text(self, x: int, y: int, s: str, c: Color = (0, 0, 0), scale: int = 2) -> int:
        """Draw ``s`` with its top-left corner at (x, y); returns the x after it."""
        for ch in s.upper():
            bits = _GLYPHS.get(ch, _GLYPHS[" "])
            for k, bit in enumerate(bits):
                if bit == "1":
                    gx, gy = x + (k % 3) * scale, y + (k // 3) * scale
                    self.rect(gx, gy, gx + scale - 1, gy + scale - 1, c)
            x += 4 * scale
        return x

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.px[y * self.w * 3 : (y + 1) * self.w * 3]) for y in range(self.h)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def _fmt(v: float) -> str:
    if v >= 1000 and v == int(v):
        return f"{v / 1000:g}K"
    return f"{v:g}"


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-9)))
    if (hi - lo) / step < 4:
        step /= 2
    start = math.floor(lo / step) * step
    return [start + k * step for k in range(int((hi - start) / step) + 2)]


def line_chart(
    path: Path,
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = False,
    size: tuple[int, int] = (900, 560),
) -> None:
    """Write a PNG line chart of ``series`` (name → (x, y) points) to ``path``."""
    pts = [p for s in series.values() for p in s if p[1] > 0 or not logy]
    if not pts:
        return
    cv = Canvas(*size)
    left, right, top, bottom = 90, size[0] - 230, 50, size[1] - 60
    xt = _ticks(min(p[0] for p in pts), max(p[0] for p in pts), logx)
    ymin = min(p[1] for p in pts) if logy else 0.0
    yt = _ticks(ymin, max(p[1] for p in pts), logy)
    fx = _scale(xt[0], xt[-1], left, right, logx)
    fy = _scale(yt[0], yt[-1], bottom, top, logy)
    for t in yt:
        cv.line(left, fy(t), right, fy(t), (225, 225, 225))
        cv.text(left - 8 - 8 * len(_fmt(t)), fy(t) - 5, _fmt(t))
    for t in xt:
        cv.line(fx(t), top, fx(t), bottom, (225, 225, 225))
        cv.text(fx(t) - 4 * len(_fmt(t)), bottom + 10, _fmt(t))
    cv.line(left, bottom, right, bottom, (0, 0, 0), 2)
    cv.line(left, top, left, bottom, (0, 0, 0), 2)
    cv.text(left, 15, title, scale=3)
    cv.text((left + right) // 2 - 4 * len(xlabel), bottom + 35, xlabel)
    cv.text(8, top - 14, ylabel)
    for k, (name, points) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        xy = [(fx(x), fy(y)) for x, y in sorted(points) if y > 0 or not logy]
        for (x0, y0), (x1, y1) in itertools.pairwise(xy):
            cv.line(x0, y0, x1, y1, color, 3)
        for x, y in xy:
            cv.rect(x - 4, y - 4, x + 4, y + 4, color)
        ly = top + 10 + 26 * k
        cv.rect(right + 20, ly, right + 40, ly + 10, color)
        cv.text(right + 48, ly, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cv.png())


def _scale(lo: float, hi: float, a: int, b: int, log: bool) -> Callable[[float], int]:
    def f(v: float) -> int:
        if log:
            frac = (math.log10(v) - math.log10(lo)) / max(math.log10(hi) - math.log10(lo), 1e-9)
        else:
            frac = (v - lo) / max(hi - lo, 1e-9)
        return round(a + (b - a) * frac)

    return f
