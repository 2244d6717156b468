"""Images in: every bound of tensorrtllm_backend.common.media, against real Pillow decoding and a
real HTTP server on loopback (reached through an injected resolver and address check; the
defaults refuse loopback)."""

from __future__ import annotations

import base64
import hashlib
import io
import ipaddress
import random
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image, ImageFile

from tensorrtllm_backend.common import media
from tensorrtllm_backend.common.media import (
    ImageBudget,
    LoadedImage,
    MediaError,
    MediaLimits,
    decode_image,
    image_from_base64,
    image_from_bytes,
    image_from_data_uri,
    image_from_url,
    is_public_address,
    parse_data_uri,
)

# --- images --------------------------------------------------------------------------------------


def encoded(fmt: str, size: tuple[int, int] = (8, 6), color: object = (200, 30, 40)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, fmt)  # type: ignore[arg-type]
    return buffer.getvalue()


def noisy_png(size: tuple[int, int] = (64, 64)) -> bytes:
    """A PNG that does not compress away, so half of it is still a proper header plus data."""
    pixels = random.Random(0).randbytes(size[0] * size[1] * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", size, pixels).save(buffer, "PNG")
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims width x height (1-bit gray)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding any pixel fails the test: a refusal must come from the header alone."""

    def load(self: Image.Image) -> None:
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(Image.Image, "load", load)
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_allowed_format_is_accepted_and_decodes_to_rgb(fmt: str) -> None:
    data = encoded(fmt)
    image = image_from_bytes(data)
    assert (image.format, image.width, image.height) == (fmt, 8, 6)
    assert image.data == data
    assert image.digest == hashlib.sha256(data).hexdigest()
    assert image.media_type == f"image/{fmt.lower()}"
    pixels = image.decode()
    assert (pixels.mode, pixels.size) == ("RGB", (8, 6))
    red, green, blue = pixels.getpixel((3, 3))  # type: ignore[misc]
    assert red > 150 and green < 80 and blue < 80


def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (4, 4), color) for color in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=10, loop=0)
    pixels = image_from_bytes(buffer.getvalue()).decode()
    assert pixels.getpixel((0, 0)) == (255, 0, 0)


def test_exif_orientation_is_applied_and_reported() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 4 wide, 2 high; shown turned by 90 degrees
    buffer = io.BytesIO()
    Image.new("RGB", (4, 2), (0, 128, 0)).save(buffer, "JPEG", exif=exif)
    image = image_from_bytes(buffer.getvalue())
    assert (image.width, image.height) == (2, 4)
    assert image.decode().size == (2, 4)


def test_transparent_pixels_become_white() -> None:
    buffer = io.BytesIO()
    Image.new("RGBA", (2, 2), (0, 0, 0, 0)).save(buffer, "PNG")
    assert image_from_bytes(buffer.getvalue()).decode().getpixel((0, 0)) == (255, 255, 255)


def test_sixteen_bit_gray_is_scaled_not_clipped() -> None:
    buffer = io.BytesIO()
    Image.new("I;16", (2, 2), 0x8000).save(buffer, "PNG")
    assert image_from_bytes(buffer.getvalue()).decode().getpixel((0, 0)) == (128, 128, 128)


def test_a_jpeg_with_extra_pictures_is_a_jpeg() -> None:
    buffer = io.BytesIO()
    first, second = Image.new("RGB", (4, 4), "red"), Image.new("RGB", (4, 4), "blue")
    first.save(buffer, "MPO", save_all=True, append_images=[second])
    assert image_from_bytes(buffer.getvalue()).format == "JPEG"


@pytest.mark.usefixtures("no_decoding")
@pytest.mark.parametrize(
    ("width", "height"), [(40_000, 40_000), (10_000, 5_000), (5_000, 5_000), (30_000, 30_000)]
)
def test_pixel_bound_is_enforced_from_the_header(width: int, height: int) -> None:
    before = Image.MAX_IMAGE_PIXELS
    bomb = png_claiming(width, height)
    assert len(bomb) < 100
    with pytest.raises(MediaError, match=r"pixels.*the limit is 16,000,000 pixels per image"):
        image_from_bytes(bomb)
    with pytest.raises(MediaError, match="TRTLLM_MAX_IMAGE_PIXELS"):
        decode_image(bomb)
    assert Image.MAX_IMAGE_PIXELS == before


def test_the_50_megapixel_message_gives_the_size() -> None:
    with pytest.raises(MediaError) as caught:
        image_from_bytes(png_claiming(10_000, 5_000))
    assert str(caught.value) == (
        "image is 10000x5000 = 50,000,000 pixels; the limit is 16,000,000 pixels per image "
        "(TRTLLM_MAX_IMAGE_PIXELS)"
    )


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_pillows_own_lower_bound_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(MediaError, match=r"1,000 pixels per image \(PIL.Image.MAX_IMAGE_PIXELS\)"):
        image_from_bytes(encoded("PNG", (40, 40)))


@pytest.mark.filterwarnings("error::PIL.Image.DecompressionBombWarning")
def test_pillows_warning_raised_as_an_error_is_a_media_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(MediaError, match=r"too many pixels .*\(PIL.Image.MAX_IMAGE_PIXELS\)"):
        image_from_bytes(encoded("PNG", (40, 40)))


def test_bytes_bound_comes_before_any_parsing(no_decoding: None) -> None:
    limits = MediaLimits(max_image_bytes=1000)
    with pytest.raises(MediaError) as caught:
        image_from_bytes(b"\x89PNG" + b"x" * 2000, limits, where="messages[0].content[1]")
    assert str(caught.value) == (
        "messages[0].content[1]: image is 2 KiB; the limit is 1000 bytes per image "
        "(TRTLLM_MAX_IMAGE_BYTES)"
    )
    just_over = MediaLimits(max_image_bytes=10 * media.MiB)
    with pytest.raises(MediaError, match=r"10,485,761 bytes; the limit is 10,485,760 bytes"):
        image_from_bytes(b"x" * (10 * media.MiB + 1), just_over)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "image is empty"),
        (b"hello, world", "data is not a PNG, JPEG, WEBP or GIF image"),
        (encoded("BMP"), "image format BMP is not supported: send PNG, JPEG, WEBP or GIF"),
        (encoded("TIFF"), "image format TIFF is not supported"),
        (noisy_png()[:3000], "PNG data is truncated or corrupt"),
        (noisy_png()[:40], "PNG data is truncated or corrupt"),
        (encoded("JPEG", (64, 64))[:300], "JPEG data is truncated or corrupt"),
        (b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image format SVG is not supported"),
    ],
)
def test_unusable_bytes_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        image_from_bytes(data)


def test_a_hand_made_loaded_image_cannot_smuggle_pixels() -> None:
    forged = LoadedImage(data=encoded("PNG", (100, 100)), format="PNG", width=1, height=1)
    with pytest.raises(MediaError, match="pixels"):
        forged.decode()


def test_error_location_can_be_added_later() -> None:
    error = MediaError("image is empty")
    assert str(error.at("image 2")) == "image 2: image is empty"
    located = MediaError("image is empty", "messages[1]")
    assert located.at("image 2") is located
    assert isinstance(error, ValueError)


# --- base64 and data: URIs -----------------------------------------------------------------------


def test_base64_with_line_breaks_is_accepted() -> None:
    data = encoded("PNG")
    text = base64.encodebytes(data).decode()  # 76-character lines
    assert "\n" in text
    assert image_from_base64(text).data == data


@pytest.mark.parametrize("text", ["not base64!", "iVBORw0KGgo", "iVBO*w0KGgo=", "données"])
def test_bad_base64_is_refused(text: str) -> None:
    with pytest.raises(MediaError, match="not valid base64"):
        image_from_base64(text)


def test_oversize_base64_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def b64decode(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("decoded")

    monkeypatch.setattr(media.base64, "b64decode", b64decode)
    with pytest.raises(MediaError, match=r"image is 1.5 KiB; the limit is 1000 bytes per image"):
        image_from_base64("A" * 2048, MediaLimits(max_image_bytes=1000))


def test_data_uri() -> None:
    data = encoded("JPEG")
    uri = "data:image/png;base64," + base64.b64encode(data).decode()  # mislabelled: bytes decide
    assert parse_data_uri(uri) == ("image/png", base64.b64encode(data).decode())
    assert image_from_data_uri(uri).format == "JPEG"
    assert image_from_url("  " + uri).data == data


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("data:text/plain;base64,aGVsbG8=", "media type 'text/plain' is not an image"),
        ("data:;base64,aGVsbG8=", r"media type '\(none\)' is not an image"),
        ("data:image/png,%89PNG", "data: URI is not base64"),
        ("data:image/png;base64", "not a data: URI"),
        ("image/png;base64,aGVsbG8=", "not a data: URI"),
    ],
)
def test_bad_data_uris_are_refused(uri: str, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        image_from_data_uri(uri)


# --- the request budget --------------------------------------------------------------------------


def test_budget_counts_images_and_bytes() -> None:
    image = image_from_bytes(encoded("PNG"))
    budget = ImageBudget(MediaLimits(max_images=2, max_request_image_bytes=len(image.data) * 2))
    budget.check_count(2)
    with pytest.raises(MediaError) as caught:
        budget.check_count(3)
    assert str(caught.value) == (
        "the request has 3 images; the limit is 2 per request (TRTLLM_MAX_IMAGES_PER_REQUEST)"
    )
    budget.add(image, "image 1")
    budget.add(image, "image 2")
    with pytest.raises(MediaError, match="^image 3: the request has 3 images"):
        budget.add(image, "image 3")
    assert (budget.count, budget.total_bytes) == (2, len(image.data) * 2)


def test_budget_refuses_a_request_over_its_byte_total() -> None:
    image = image_from_bytes(noisy_png())
    budget = ImageBudget(MediaLimits(max_request_image_bytes=len(image.data) + 10))
    budget.add(image, "messages[0].content[0]")
    with pytest.raises(MediaError) as caught:
        budget.add(image, "messages[0].content[1]")
    assert str(caught.value).startswith("messages[0].content[1]: the request's images total ")
    assert "per request (TRTLLM_MAX_REQUEST_IMAGE_BYTES)" in str(caught.value)
    assert budget.count == 1


def test_default_limits() -> None:
    limits = MediaLimits()
    assert (limits.max_image_bytes, limits.max_request_image_bytes) == (10 << 20, 32 << 20)
    assert (limits.max_image_pixels, limits.max_images) == (16_000_000, 8)
    assert (limits.fetch_timeout_s, limits.allowed_domains, limits.max_redirects) == (10.0, (), 3)
    assert MediaLimits(allowed_domains=(" Images.Test. ", "")).allowed_domains == ("images.test",)
    with pytest.raises(ValueError):
        MediaLimits(max_image_bytes=0)


# --- URL rules, before anything is contacted -----------------------------------------------------

ALLOWED = MediaLimits(allowed_domains=("images.test",))


class Resolver:
    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown")
        return self.table[host]


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    attempts: list[object] = []

    def connect(address: object, *args: object, **kwargs: object) -> socket.socket:
        attempts.append(address)
        raise AssertionError(f"connected to {address}")

    monkeypatch.setattr(media.socket, "create_connection", connect)
    return attempts


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://images.test/cat.png",
        "gopher://images.test/",
        "javascript:alert(1)",
        "//images.test/cat.png",
        "images.test/cat.png",
    ],
)
def test_other_schemes_are_refused(url: str, no_connections: list[object]) -> None:
    resolve = Resolver({"images.test": ["93.184.216.34"]})
    with pytest.raises(MediaError, match=r"scheme .* is not supported: send a data: URI"):
        image_from_url(url, ALLOWED, resolve=resolve)
    assert resolve.asked == [] and no_connections == []


def test_remote_urls_are_off_by_default(no_connections: list[object]) -> None:
    resolve = Resolver({"images.test": ["93.184.216.34"]})
    with pytest.raises(MediaError) as caught:
        image_from_url("https://images.test/cat.png", where="input[0]", resolve=resolve)
    assert str(caught.value) == (
        "input[0]: remote image URLs are off on this server: send the image as a data: URI "
        "(data:image/png;base64,...), or have the operator list the host in "
        "TRTLLM_ALLOWED_MEDIA_DOMAINS"
    )
    assert resolve.asked == [] and no_connections == []


@pytest.mark.parametrize(
    "url",
    [
        "https://evil.test/cat.png",
        "https://images.test.evil.test/cat.png",
        "https://sub.images.test/cat.png",
        "https://images.test@evil.test/cat.png",
        "http://127.0.0.1/cat.png",
    ],
)
def test_hosts_not_listed_are_refused(url: str, no_connections: list[object]) -> None:
    resolve = Resolver({})
    with pytest.raises(MediaError, match="is not allowed|credentials"):
        image_from_url(url, ALLOWED, resolve=resolve)
    assert resolve.asked == [] and no_connections == []


def test_host_match_ignores_case_and_a_trailing_dot(no_connections: list[object]) -> None:
    resolve = Resolver({"images.test": ["10.0.0.1"]})
    with pytest.raises(MediaError, match="non-public address"):
        image_from_url("https://IMAGES.Test./cat.png", ALLOWED, resolve=resolve)
    assert resolve.asked == ["images.test"]


@pytest.mark.parametrize(
    "addresses",
    [
        ["127.0.0.1"],
        ["10.0.0.1"],
        ["169.254.169.254"],
        ["::1"],
        ["::ffff:127.0.0.1"],
        ["0.0.0.0"],
        ["93.184.216.34", "192.168.1.1"],  # one inside is enough to refuse the host
        ["fe80::1%1"],
        ["100.64.0.1"],
    ],
)
def test_hosts_resolving_inside_are_never_contacted(
    addresses: list[str], no_connections: list[object]
) -> None:
    with pytest.raises(MediaError) as caught:
        image_from_url(
            "https://images.test/cat.png", ALLOWED, resolve=Resolver({"images.test": addresses})
        )
    assert str(caught.value) == (
        "image URL host 'images.test' resolves to a non-public address; images are fetched only "
        "from the public internet"
    )
    assert no_connections == []


def test_an_unresolvable_host(no_connections: list[object]) -> None:
    with pytest.raises(MediaError, match="'images.test' cannot be resolved"):
        image_from_url("https://images.test/cat.png", ALLOWED, resolve=Resolver({}))


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("64:ff9b::808:808", True),  # NAT64 of a public address
        ("::ffff:8.8.8.8", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.0.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("240.0.0.1", False),
        ("255.255.255.255", False),
        ("::", False),
        ("::1", False),
        ("::ffff:10.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("64:ff9b::a00:1", False),
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("fc00::1", False),
        ("fe80::1", False),
        ("fec0::1", False),
        ("ff02::1", False),
    ],
)
def test_public_addresses(address: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is public


# --- real fetches from a loopback server ---------------------------------------------------------

Route = Callable[[BaseHTTPRequestHandler], None]


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that give up (TLS refused, deadline) are what these tests make happen


class ImageServer:
    """A real HTTP server on 127.0.0.1 with per-path handlers; it records what it was asked."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[tuple[str, str]] = []  # (path, Host header)
        self.release = threading.Event()  # lets handlers that hang end at teardown
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append((self.path, self.headers.get("Host", "")))
                route = owner.routes.get(self.path.partition("?")[0])
                if route is None:
                    self.send_error(404)
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading: the point of some tests

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[Callable[..., ImageServer]]:
    started: list[ImageServer] = []

    def start(tls: ssl.SSLContext | None = None) -> ImageServer:
        started.append(ImageServer(tls))
        return started[-1]

    yield start
    for server in started:
        server.close()


def serve(body: bytes, status: int = 200, length: bool = True, **headers: str) -> Route:
    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "image/png")
        if length:
            handler.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)

    return route


def redirect(location: str, status: int = 302) -> Route:
    return serve(b"", status, Location=location)


def loopback_only(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return address == ipaddress.IPv4Address("127.0.0.1")


def fetch(url: str, limits: MediaLimits = ALLOWED, **kwargs: object) -> LoadedImage:
    table = {"images.test": ["127.0.0.1"], "cdn.test": ["127.0.0.1"]}
    kwargs.setdefault("resolve", Resolver(table))
    return image_from_url(url, limits, address_allowed=loopback_only, **kwargs)  # type: ignore[arg-type]


def test_an_allowed_host_is_fetched(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    png = encoded("PNG")
    server.routes["/cat.png"] = serve(png)
    image = fetch(f"http://images.test:{server.port}/cat.png?size=1#fragment")
    assert image.data == png and image.format == "PNG"
    # Connected to the checked address, yet the server was asked for the hostname.
    assert server.requests == [("/cat.png?size=1", f"images.test:{server.port}")]


def test_the_default_address_check_refuses_the_loopback_server(
    servers: Callable[..., ImageServer],
) -> None:
    server = servers()
    server.routes["/cat.png"] = serve(encoded("PNG"))
    with pytest.raises(MediaError, match="non-public address"):
        image_from_url(
            f"http://images.test:{server.port}/cat.png",
            ALLOWED,
            resolve=Resolver({"images.test": ["127.0.0.1"]}),
        )
    assert server.requests == []


def test_a_declared_oversize_body_is_refused(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    server.routes["/big.png"] = serve(noisy_png())
    limits = MediaLimits(allowed_domains=("images.test",), max_image_bytes=1000)
    with pytest.raises(MediaError, match=r"body is .* KiB; the limit is 1000 bytes per image"):
        fetch(f"http://images.test:{server.port}/big.png", limits)


def test_an_endless_body_is_cut_at_the_bound(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    sent: list[int] = []

    def endless(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.end_headers()  # no Content-Length: the body ends when the server closes
        sent.append(0)
        while not server.release.is_set() and sent[0] < 64 * media.MiB:
            handler.wfile.write(b"\x89PNG" * 16384)
            sent[0] += 65536

    server.routes["/endless.png"] = endless
    limits = MediaLimits(allowed_domains=("images.test",), max_image_bytes=256 * 1024)
    started = time.monotonic()
    with pytest.raises(MediaError, match=r"body is over 256 KiB, the limit per image"):
        fetch(f"http://images.test:{server.port}/endless.png", limits)
    assert time.monotonic() - started < 2


def test_an_error_status_is_refused(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    with pytest.raises(MediaError, match="^image URL answered HTTP 404$"):
        fetch(f"http://images.test:{server.port}/missing.png")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "cannot be fetched"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nxx", "data is not a PNG"),
        (b"SMTP ready\r\n", "cannot be fetched"),
    ],
)
def test_a_malformed_answer_is_refused(
    servers: Callable[..., ImageServer], answer: bytes, message: str
) -> None:
    server = servers()
    server.routes["/cat.png"] = lambda handler: handler.wfile.write(answer) and None
    with pytest.raises(MediaError, match=message):
        fetch(f"http://images.test:{server.port}/cat.png")


def test_a_redirect_to_a_host_not_listed_is_never_followed(
    servers: Callable[..., ImageServer],
) -> None:
    server, other = servers(), servers()
    other.routes["/cat.png"] = serve(encoded("PNG"))
    server.routes["/cat.png"] = redirect(f"http://cdn.test:{other.port}/cat.png")
    resolve = Resolver({"images.test": ["127.0.0.1"], "cdn.test": ["127.0.0.1"]})
    with pytest.raises(MediaError, match="host 'cdn.test' is not allowed"):
        fetch(f"http://images.test:{server.port}/cat.png", resolve=resolve)
    assert other.requests == []
    assert resolve.asked == ["images.test"]


def test_a_redirect_inside_the_network_is_never_followed(
    servers: Callable[..., ImageServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = servers()
    server.routes["/cat.png"] = redirect("http://images.test:81/metadata")
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[str]:  # rebinding: inside on the second lookup
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["169.254.169.254"]

    with pytest.raises(MediaError, match="non-public address"):
        fetch(f"http://images.test:{server.port}/cat.png", resolve=resolve)
    assert len(server.requests) == 1


def test_a_redirect_on_the_allowed_host_is_followed(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    gif = encoded("GIF")
    server.routes["/old.gif"] = redirect("/new.gif", 301)
    server.routes["/new.gif"] = serve(gif)
    assert fetch(f"http://images.test:{server.port}/old.gif").data == gif
    assert [path for path, _ in server.requests] == ["/old.gif", "/new.gif"]


def test_redirects_are_counted(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    server.routes["/loop.png"] = redirect("/loop.png", 307)
    with pytest.raises(
        MediaError, match=r"redirects more than 3 times \(TRTLLM_MAX_MEDIA_REDIRECTS\)"
    ):
        fetch(f"http://images.test:{server.port}/loop.png")
    assert len(server.requests) == 4


def test_a_redirect_to_another_scheme_is_refused(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    server.routes["/cat.png"] = redirect("file:///etc/passwd")
    with pytest.raises(MediaError, match="scheme file: is not supported"):
        fetch(f"http://images.test:{server.port}/cat.png")


def test_a_server_that_never_answers_times_out(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    server.routes["/slow.png"] = lambda handler: server.release.wait(30) and None
    limits = MediaLimits(allowed_domains=("images.test",), fetch_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(MediaError) as caught:
        fetch(f"http://images.test:{server.port}/slow.png", limits)
    assert 0.25 < time.monotonic() - started < 1.5
    assert str(caught.value) == (
        "image URL was not fetched within 0.3 s (TRTLLM_MEDIA_FETCH_TIMEOUT_S)"
    )


def test_a_server_that_trickles_is_held_to_the_deadline(
    servers: Callable[..., ImageServer],
) -> None:
    server = servers()

    def trickle(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.0 200 OK\r\n")
        while not server.release.wait(0.02):  # each byte well within any per-read timeout
            handler.wfile.write(b"X")
            handler.wfile.flush()

    server.routes["/trickle.png"] = trickle
    limits = MediaLimits(allowed_domains=("images.test",), fetch_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(MediaError, match="was not fetched within 0.3 s"):
        fetch(f"http://images.test:{server.port}/trickle.png", limits)
    assert time.monotonic() - started < 1.5


def test_a_hanging_resolver_is_held_to_the_deadline() -> None:
    def resolve(host: str, port: int) -> list[str]:
        time.sleep(2)
        return ["127.0.0.1"]

    limits = MediaLimits(allowed_domains=("images.test",), fetch_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(MediaError, match="was not fetched within 0.2 s"):
        fetch("http://images.test/cat.png", limits, resolve=resolve)
    assert time.monotonic() - started < 1


def test_a_refused_connection(servers: Callable[..., ImageServer]) -> None:
    server = servers()
    port = server.port
    server.close()
    with pytest.raises(MediaError, match="image URL cannot be fetched: .*refused"):
        fetch(f"http://images.test:{port}/cat.png")


# --- TLS: the certificate is checked for the hostname, not the address connected to -------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=images.test",
         "-addext", "subjectAltName=DNS:images.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


def tls_server(servers: Callable[..., ImageServer], certificate: tuple[Path, Path]) -> ImageServer:
    key, cert = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = servers(context)
    server.routes["/cat.webp"] = serve(encoded("WEBP"))
    return server


def test_https_checks_the_certificate_for_the_hostname(
    servers: Callable[..., ImageServer], certificate: tuple[Path, Path]
) -> None:
    server = tls_server(servers, certificate)
    trusted = ssl.create_default_context(cafile=str(certificate[1]))
    image = fetch(f"https://images.test:{server.port}/cat.webp", tls_context=trusted)
    assert image.format == "WEBP"
    assert server.requests == [("/cat.webp", f"images.test:{server.port}")]


def test_https_refuses_a_certificate_for_another_name(
    servers: Callable[..., ImageServer], certificate: tuple[Path, Path]
) -> None:
    server = tls_server(servers, certificate)
    trusted = ssl.create_default_context(cafile=str(certificate[1]))
    limits = MediaLimits(allowed_domains=("cdn.test",))
    with pytest.raises(MediaError, match="TLS connection failed: .*cdn.test"):
        fetch(f"https://cdn.test:{server.port}/cat.webp", limits, tls_context=trusted)
    with pytest.raises(MediaError, match="TLS connection failed: .*certificate"):
        fetch(f"https://images.test:{server.port}/cat.webp")  # the system's trust store
    assert server.requests == []
