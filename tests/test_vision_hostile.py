"""Hostile or broken images against a real ``modelc run --mmproj`` (the tiny Gemma 3 VLM
of ``tests/gen_gemma3vl.py``), all made here with Pillow or by hand (none committed).

* Fifty-odd that must be refused, each a 400 whose message is one line about the image:
  PNG, JPEG, WebP and GIF truncated at many offsets, wrong magic, other formats and not
  images at all, 30000 x 30000 (and other too-large sizes) declared, zero-size, corrupt
  chunks, a decompression bomb, and the ways the bytes can be wrapped wrongly (bad or
  nested base64, a data URL of another type, URLs of other schemes, a bad image deep in a
  conversation or among Ollama's ``images``).
* Odd but valid ones, ACCEPTED and answered as docs/api.md says (prompt tokens as for
  any image): 1 x 1, 16384 x 1, animations (GIF, WebP, APNG: the first frame, the same
  answer as that frame alone), CMYK JPEG, 16-bit PNG, a palette with transparency, gray
  with alpha, interlaced and progressive, a 1 MiB ICC profile, an EXIF rotation (not
  applied, as llama.cpp's ``stb_image``), a data URL whose image type is not the bytes'.

They go concurrently in batches to one server, and after each batch the server answers
a normal request.
"""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import net
from tests.gen_gemma3vl import ensure_model
from tests.peers import HTTP_TIMEOUT
from tests.server_fixtures import Server, start

IMAGES = Path(__file__).parent / "fixtures" / "vision"
QUESTION = "What is in the picture?"
Req = tuple[str, dict[str, Any]]  # route, body
Case = tuple[str, str, dict[str, Any]]  # what, route, body


@pytest.fixture(scope="module")
def vlm() -> Iterator[Server]:
    _, gg, mm = ensure_model()
    srv = start(str(gg), "--mmproj", str(mm), "--kv-cache", "f32", env={"MODELC_MATMUL": "exact"})
    yield srv
    srv.stop()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + b64(data)


def chat(url: Any, *, before: list[Any] | None = None) -> Req:
    """An OpenAI chat request: the image part (``image_url`` as given) then the question."""
    image = {"type": "image_url", "image_url": url if isinstance(url, dict) else {"url": url}}
    msgs = [
        *(before or []),
        {"role": "user", "content": [image, {"type": "text", "text": QUESTION}]},
    ]
    body = {"model": "gemma3vl", "messages": msgs, "max_tokens": 3, "temperature": 0}
    return "/v1/chat/completions", {**body, "return_token_ids": True}


def ollama_chat(images: list[str]) -> Req:
    msg = {"role": "user", "content": QUESTION, "images": images}
    body = {"model": "gemma3vl", "messages": [msg], "stream": False, "options": {"num_predict": 3}}
    return "/api/chat", body


def save(img: Any, fmt: str, **kw: Any) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    return out.getvalue()


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_of(w: int, h: int, *chunks: bytes, depth: int = 8, color: int = 2) -> bytes:
    """A PNG whose IHDR declares w x h (valid CRCs), then ``chunks``, then IEND."""
    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + b"".join(chunks) + chunk(b"IEND", b"")


def noise(size: tuple[int, int] = (48, 48), seed: int = 7) -> Any:
    """An RGB image of random pixels (nothing compresses: a cut loses pixels)."""
    from PIL import Image

    return Image.frombytes("RGB", size, random.Random(seed).randbytes(size[0] * size[1] * 3))


def frames() -> list[Any]:
    from PIL import Image

    return [Image.new("RGB", (20, 30), c) for c in ((250, 0, 0), (0, 0, 250))]


def patch(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


def files() -> list[tuple[str, bytes, str]]:
    """Broken or hostile image bytes: (what, bytes, the data URL's image type)."""
    from PIL import Image

    rgb = noise()
    png, jpg = save(rgb, "PNG"), save(rgb, "JPEG", quality=95)
    webp, gif = save(rgb, "WEBP", quality=90), save(rgb.convert("P"), "GIF")
    out: list[tuple[str, bytes, str]] = []
    cuts = {
        "png": (png, (1, 8, 16, 30, 33, 41, len(png) // 3, len(png) // 2, len(png) - 40)),
        "jpeg": (jpg, (2, 4, 20, 150, len(jpg) // 3, len(jpg) // 2, len(jpg) - 30)),
        "webp": (webp, (4, 12, 16, 30, len(webp) // 2, len(webp) - 10)),
        "gif": (gif, (3, 6, 13, 40, len(gif) // 2, len(gif) - 40)),
    }
    for kind, (data, at) in cuts.items():
        out += [(f"{kind} truncated at {n} of {len(data)}", data[:n], kind) for n in at]
    sof = jpg.index(b"\xff\xc0")  # SOF0: length(2) precision(1) height(2) width(2)
    out += [
        ("png, wrong magic", b"\x88" + png[1:], "png"),
        ("jpeg, wrong magic", b"\xff\xd9" + jpg[2:], "jpeg"),
        ("gif, wrong magic", b"GIF88a" + gif[6:], "gif"),
        ("webp, wrong magic", patch(webp, 8, b"WEBQ"), "webp"),
        *(
            (f"a {f} file", save(rgb, f), "png")
            for f in ("BMP", "TIFF", "ICO", "PPM", "PCX", "TGA")
        ),
        ("svg", b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>', "svg+xml"),
        ("html", b"<!doctype html><title>x</title><img src=x>", "png"),
        ("a pdf header", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n", "png"),
        ("a zip header", b"PK\x03\x04" + bytes(26), "png"),
        ("random bytes", random.Random(1).randbytes(4096), "png"),
        ("zero bytes", bytes(1024), "png"),
        ("png declaring 30000x30000", png_of(30000, 30000), "png"),
        ("png declaring 16385x1", png_of(16385, 1), "png"),
        ("png declaring 10000x6000 (60 megapixels)", png_of(10000, 6000), "png"),
        (
            "jpeg declaring 30000x30000",
            patch(jpg, sof + 5, struct.pack(">HH", 30000, 30000)),
            "jpeg",
        ),
        ("gif declaring 30000x30000", patch(gif, 6, struct.pack("<HH", 30000, 30000)), "gif"),
        ("webp declaring 20000x20000", _vp8x(webp, 20000, 20000), "webp"),
        ("png declaring 0x0", png_of(0, 0), "png"),
        ("png declaring 0x16", png_of(0, 16), "png"),
        ("jpeg declaring height 0", patch(jpg, sof + 5, b"\x00\x00"), "jpeg"),
        ("png, bad IHDR checksum", patch(png, 29, b"\x00\x00\x00\x00"), "png"),
        (
            "png, IDAT not zlib",
            png_of(16, 16, chunk(b"IDAT", random.Random(2).randbytes(200))),
            "png",
        ),
        ("png, bit depth 3", png_of(16, 16, depth=3), "png"),
        ("png, header then junk", png_of(16, 16, bytes(64)), "png"),
        (
            "decompression bomb (8000x8000 of black)",
            save(Image.new("1", (8000, 8000)), "PNG"),
            "png",
        ),
    ]
    return out


def _vp8x(webp: bytes, w: int, h: int) -> bytes:
    """An extended WebP whose canvas is w x h around a small lossy image."""
    canvas = bytes(4) + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    body = b"WEBP" + b"VP8X" + struct.pack("<I", 10) + canvas + webp[12:]
    return b"RIFF" + struct.pack("<I", len(body)) + body


def refused() -> list[Case]:
    """Every case that must be a 400."""
    png = (IMAGES / "wide.png").read_bytes()
    url = data_url(png)
    cases: list[Case] = [(what, *chat(data_url(data, kind))) for what, data, kind in files()]
    earlier = [*chat(url)[1]["messages"], {"role": "assistant", "content": "Hello."}]
    wrapped: list[tuple[str, Req]] = [
        ("empty data URL", chat("data:image/png;base64,")),
        ("not base64", chat("data:image/png;base64,@@not base64@@")),
        ("bad base64 padding", chat("data:image/png;base64,iVBORw0KGgoA")),
        ("a space inside the base64", chat(url[:40] + " " + url[40:])),
        ("base64 of base64", chat(data_url(b64(png).encode()))),
        ("a data URL in a data URL", chat(data_url(url.encode()))),
        ("a data URL not base64", chat("data:image/png,raw")),
        ("a data URL of text/plain", chat("data:text/plain;base64," + b64(png))),
        ("a data URL without a type", chat("data:;base64," + b64(png))),
        ("a data URL without a comma", chat("data:image/png;base64")),
        ("an https URL", chat("https://example.com/cat.png")),
        ("a file URL", chat("file:///etc/passwd")),
        ("an ftp URL", chat("ftp://example.com/cat.png")),
        ("a javascript URL", chat("javascript:alert(1)")),
        ("a number for a URL", chat(5)),
        ("an image_url without url", chat({"detail": "auto"})),
        (
            "a good image, then a truncated one in messages[2]",
            chat(data_url(png[:60]), before=earlier),
        ),
        ("ollama: images not base64", ollama_chat(["%%%"])),
        ("ollama: images of text", ollama_chat([b64(b"hello")])),
        ("ollama: the second image truncated", ollama_chat([b64(png), b64(png[:60])])),
    ]
    return cases + [(what, *req) for what, req in wrapped]


def accepted() -> dict[str, bytes]:
    """Odd but valid images (see the module docstring), by what they are; the data URL
    says PNG for each (the bytes say what they are)."""
    from PIL import Image

    rgb = noise((40, 30), seed=3)
    f = frames()
    rotated = Image.Exif()
    rotated[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to show
    palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    return {
        "1x1 png": save(Image.new("RGB", (1, 1), (9, 9, 9)), "PNG"),
        "1x1 jpeg": save(Image.new("RGB", (1, 1), (9, 9, 9)), "JPEG"),
        "16384x1 png": save(Image.new("L", (16384, 1), 128), "PNG"),
        "animated gif": save(f[0], "GIF", save_all=True, append_images=f[1:], duration=50),
        "animated webp": save(f[0], "WEBP", save_all=True, append_images=f[1:], lossless=True),
        "apng": save(f[0], "PNG", save_all=True, append_images=f[1:], duration=50),
        "first frame": save(f[0], "PNG"),
        "cmyk jpeg": save(rgb.convert("CMYK"), "JPEG"),
        "16-bit png": save(rgb.convert("L").convert("I;16"), "PNG"),
        "palette with transparency": save(palette, "PNG", transparency=0),
        "gray with alpha": save(rgb.convert("LA"), "PNG"),
        "interlaced png": save(rgb, "PNG", interlace=1),
        "progressive jpeg": save(rgb, "JPEG", progressive=True),
        "1 MiB ICC profile": save(rgb, "PNG", icc_profile=random.Random(4).randbytes(1 << 20)),
        "exif-rotated jpeg": save(rgb, "JPEG", exif=rotated),
        "jpeg sent as png": save(rgb, "JPEG"),
    }


def message(r: httpx.Response) -> str:
    err = r.json()["error"]
    return str(err if isinstance(err, str) else err["message"])


def run_all(client: httpx.Client, cases: list[Case]) -> list[httpx.Response]:
    post: Callable[[Case], httpx.Response] = lambda c: client.post(c[1], json=c[2])  # noqa: E731
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(post, cases))


def still_serving(client: httpx.Client) -> int:
    """A normal image request answered; its prompt token count."""
    route, body = chat(data_url((IMAGES / "gray.png").read_bytes()))
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    text = {"model": "gemma3vl", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert client.post("/v1/chat/completions", json=text).status_code == 200
    return int(r.json()["usage"]["prompt_tokens"])


def test_fifty_hostile_images_each_get_a_400(vlm: Server) -> None:
    cases = refused()
    assert len(cases) >= 50 and len({what for what, _, _ in cases}) == len(cases)
    with net.client(base_url=vlm.url, timeout=HTTP_TIMEOUT) as client:
        for k in range(0, len(cases), 20):
            batch = cases[k : k + 20]
            for (what, _, _), r in zip(batch, run_all(client, batch), strict=True):
                assert r.status_code == 400, (what, r.status_code, r.text[:300])
                msg = message(r)
                assert "\n" not in msg and "image" in msg.lower(), (what, msg)
            still_serving(client)
        # a bad image deep in a conversation is named by its place among the request's
        deep = next(c for c in cases if c[0].startswith("a good image, then"))
        r = client.post(deep[1], json=deep[2])
        assert r.json()["error"]["param"] == "image 2", r.text


def test_odd_but_valid_images_are_answered(vlm: Server) -> None:
    images = accepted()
    with net.client(base_url=vlm.url, timeout=HTTP_TIMEOUT) as client:
        tokens = still_serving(client)
        cases = [(what, *chat(data_url(data))) for what, data in images.items()]
        answers = {}
        for (what, _, _), r in zip(cases, run_all(client, cases), strict=True):
            assert r.status_code == 200, (what, r.text[:300])
            j = r.json()
            assert j["usage"]["prompt_tokens"] == tokens, (what, j["usage"])
            answers[what] = j["choices"][0]["token_ids"]
        still_serving(client)
    for what in ("animated gif", "animated webp", "apng"):
        assert answers[what] == answers["first frame"], what
