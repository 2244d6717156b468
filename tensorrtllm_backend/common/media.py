"""Images a client sent, turned into validated bytes with every bound enforced.

The one place where OpenAI ``image_url`` parts (data: URIs or http(s) URLs), Anthropic base64/url
image blocks and Responses ``input_image`` items become image bytes. Everything here treats its
input as hostile:

- sizes are checked before work: encoded bytes before decoding base64 or an image, a body while
  it is read, pixels from the image header before any pixel is decoded (decompression bombs);
- only PNG, JPEG, WEBP and GIF are opened (Pillow is told to try no other parser);
- remote URLs are off unless the operator lists hosts (``MediaLimits.allowed_domains``, exact
  hostname match, case-insensitive, a trailing dot ignored; no wildcards, subdomains are not
  included). A listed host is fetched only if every address it resolves to is public, and the
  connection goes to the address that was checked (no second DNS lookup, so DNS rebinding has no
  window) while the Host header, TLS SNI and certificate check use the hostname. Redirects are
  checked like the first URL; a host not listed is never contacted.

Neutral code: imported by the BentoML worker and inside Triton's Python stubs, so it uses only
the standard library and Pillow. Synchronous and blocking: callers run it off their event loop.

Errors are :class:`MediaError` (a ValueError) with a short message saying what is wrong and what
to do; a caller names the image's place in its request (``where="messages[0].content[1]"``),
which prefixes the message.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import http.client
import io
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

from PIL import Image, ImageFile

MiB = 1024 * 1024

# The environment variables (read in settings.py) that set each MediaLimits field: the messages
# name them so an operator knows which knob a refusal came from.
LIMIT_VARIABLES = {
    "max_image_bytes": "TRTLLM_MAX_IMAGE_BYTES",
    "max_request_image_bytes": "TRTLLM_MAX_REQUEST_IMAGE_BYTES",
    "max_image_pixels": "TRTLLM_MAX_IMAGE_PIXELS",
    "max_images": "TRTLLM_MAX_IMAGES_PER_REQUEST",
    "fetch_timeout_s": "TRTLLM_MEDIA_FETCH_TIMEOUT_S",
    "allowed_domains": "TRTLLM_ALLOWED_MEDIA_DOMAINS",
    "max_redirects": "TRTLLM_MAX_MEDIA_REDIRECTS",
}

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
_FORMATS_TEXT = "PNG, JPEG, WEBP or GIF"
_PILLOW_FORMATS = (*FORMATS, "MPO")  # Pillow names a JPEG with extra pictures MPO
_ALLOWED_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"RIFF", "WEBP"),
)

# Only to name a refused format in the message; these bytes are never handed to a parser.
_OTHER_SIGNATURES = (
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"8BPS", "PSD"),
    (b"%PDF", "PDF"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
)
_ISO_BRANDS = {b"avif": "AVIF", b"avis": "AVIF", b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF"}

_EXIF_ORIENTATION = 0x0112
_TRANSPOSES = {  # EXIF orientation -> what turns the stored pixels upright
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

_REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 64 * 1024
_USER_AGENT = "bentotrtllm-media/1"


class MediaError(ValueError):
    """An image a client sent is refused; the message says why and what to do.

    ``where`` names the image's place in the request; it prefixes the message. A caller that
    catches an error raised without one can add it with :meth:`at`.
    """

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.message = message
        self.where = where

    def at(self, where: str) -> MediaError:
        """This error located at ``where``, unless it already names a place."""
        if self.where or not where:
            return self
        return MediaError(self.message, where)


@dataclass(frozen=True)
class MediaLimits:
    """Every bound on the images of one request (the variables in LIMIT_VARIABLES set them)."""

    max_image_bytes: int = 10 * MiB  # encoded bytes of one image
    max_request_image_bytes: int = 32 * MiB  # their sum over a request
    max_image_pixels: int = 16_000_000  # width * height of one image
    max_images: int = 8  # per request
    fetch_timeout_s: float = 10.0  # one remote image, redirects included, start to end
    allowed_domains: tuple[str, ...] = ()  # hostnames remote images may come from; () = none
    max_redirects: int = 3

    def __post_init__(self) -> None:
        for name in ("max_image_bytes", "max_request_image_bytes", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"MediaLimits.{name} must be at least 1")
        if self.max_images < 0 or self.max_redirects < 0:
            raise ValueError("MediaLimits.max_images and max_redirects must be 0 or more")
        if not self.fetch_timeout_s > 0:
            raise ValueError("MediaLimits.fetch_timeout_s must be more than 0")
        # Stored normalized, so a lookup is one comparison with the URL's normalized host.
        domains = tuple(dict.fromkeys(_normal_host(d) for d in self.allowed_domains if d.strip()))
        object.__setattr__(self, "allowed_domains", domains)


DEFAULT_LIMITS = MediaLimits()


@dataclass(frozen=True)
class LoadedImage:
    """An image that passed every check: its bytes as received and what its header says.

    ``width`` and ``height`` are those of :meth:`decode`'s result (EXIF orientation applied).
    ``digest`` (sha256 hex of ``data``) is the image's identity, e.g. in a prefix cache.
    """

    data: bytes = field(repr=False)
    format: str  # one of FORMATS
    width: int
    height: int
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", hashlib.sha256(self.data).hexdigest())

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]

    def decode(self) -> Image.Image:
        """The pixels, RGB (GIF: its first frame). Re-checked against this image's own size, so a
        LoadedImage built by hand cannot smuggle a bigger one in."""
        own = MediaLimits(
            max_image_bytes=max(len(self.data), 1),
            max_image_pixels=max(self.width * self.height, 1),
        )
        return decode_image(self.data, own)


# --- bytes -> image ------------------------------------------------------------------------------


def image_from_bytes(
    data: bytes, limits: MediaLimits = DEFAULT_LIMITS, *, where: str = ""
) -> LoadedImage:
    """Validate encoded image bytes: size, format, pixels from the header, then a full decode
    that proves the file is whole. Nothing is decoded before the header passed."""
    _check_size(len(data), limits, where)
    with _opened(data, limits, where) as image:
        _load(image, limits, where)
        width, height = image.size
        if _orientation(image) >= 5:  # 5 to 8 turn the image by 90 degrees
            width, height = height, width
        return LoadedImage(data=bytes(data), format=_format(image), width=width, height=height)


def decode_image(
    data: bytes, limits: MediaLimits = DEFAULT_LIMITS, *, where: str = ""
) -> Image.Image:
    """Decode image bytes to RGB for a model: the engine side's entry, on bytes it received from
    another process. Format and pixel bound are checked again before the full decode."""
    _check_size(len(data), limits, where)
    with _opened(data, limits, where) as image:
        _load(image, limits, where)
        try:
            rgb = _to_rgb(image)
            transpose = _TRANSPOSES[_orientation(image)]
            return rgb if transpose is None else rgb.transpose(transpose)
        except Exception as error:  # an unusual mode Pillow cannot convert
            raise MediaError(f"{_format(image)} image cannot be converted to RGB", where) from error


def image_from_base64(
    text: str, limits: MediaLimits = DEFAULT_LIMITS, *, where: str = ""
) -> LoadedImage:
    """Strict base64 (line breaks and spaces tolerated) to a validated image. The decoded size
    is known from the text's length, so an oversize image is refused before it is decoded."""
    compact = "".join(text.split())
    padding = len(compact) - len(compact.rstrip("="))
    _check_size(max(len(compact) // 4 * 3 - min(padding, 2), 0), limits, where)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(
            "image data is not valid base64 (standard alphabet A-Z a-z 0-9 + /, '=' padding)",
            where,
        ) from None
    return image_from_bytes(data, limits, where=where)


def parse_data_uri(uri: str, *, where: str = "") -> tuple[str, str]:
    """``data:<media type>[;params];base64,<payload>`` -> (media type, lowercased, no params;
    the base64 payload). Only base64 data URIs carry images, so others are refused here."""
    head, comma, payload = uri.strip().partition(",")
    if head[:5].lower() != "data:" or not comma:
        raise MediaError("not a data: URI (expected data:image/png;base64,...)", where)
    media_type, *params = head[5:].split(";")
    if not params or params[-1].strip().lower() != "base64":
        raise MediaError("data: URI is not base64 (expected data:image/png;base64,...)", where)
    return media_type.strip().lower(), payload


def image_from_data_uri(
    uri: str, limits: MediaLimits = DEFAULT_LIMITS, *, where: str = ""
) -> LoadedImage:
    """A ``data:image/...;base64,...`` URI to a validated image. The declared subtype is not
    trusted: the bytes decide the format (clients often label a JPEG image/png)."""
    media_type, payload = parse_data_uri(uri, where=where)
    if not media_type.startswith("image/"):
        raise MediaError(
            f"data: URI media type {media_type or '(none)'!r} is not an image "
            "(expected data:image/png;base64,...)",
            where,
        )
    return image_from_base64(payload, limits, where=where)


# --- URLs ----------------------------------------------------------------------------------------

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Iterable[str]]  # (host, port) -> IP addresses as text
AddressCheck = Callable[[IPAddress], bool]  # True: this address may be contacted

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def is_public_address(address: IPAddress) -> bool:
    """Whether an address is on the public internet: never loopback, private, link-local,
    multicast, reserved, unspecified or shared (CGNAT), and for IPv6 forms that embed an IPv4
    address (mapped, 6to4, NAT64), never one whose IPv4 address is any of those."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            # The packets reach the embedded IPv4 address: judge that one. The wrappers' own
            # ranges say nothing about it (::ffff:0:0/96 and 64:ff9b::/96 sit in reserved ::/8).
            return is_public_address(embedded)
        if address.is_site_local:
            return False
    return address.is_global and not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def resolve_host(host: str, port: int) -> list[str]:
    """The system resolver's addresses for ``host`` (getaddrinfo), in its order, once each."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def image_from_url(
    url: str,
    limits: MediaLimits = DEFAULT_LIMITS,
    *,
    where: str = "",
    resolve: Resolver = resolve_host,
    address_allowed: AddressCheck = is_public_address,
    tls_context: ssl.SSLContext | None = None,
) -> LoadedImage:
    """An image from a URL a client sent: a data: URI, or an http(s) URL on a listed host.

    ``resolve`` and ``address_allowed`` exist for tests and unusual networks; the defaults (the
    system resolver, public addresses only) never admit loopback or private addresses.
    ``tls_context`` defaults to the system's trust store with hostname checking.
    """
    text = url.strip()
    if text[:5].lower() == "data:":
        return image_from_data_uri(text, limits, where=where)
    data = _fetch(text, limits, where, resolve, address_allowed, tls_context)
    return image_from_bytes(data, limits, where=where)


# --- the budget of one request -------------------------------------------------------------------


class ImageBudget:
    """The images of one request, counted and summed against its limits. Thread-safe, for
    callers that fetch a request's images concurrently.

    Call :meth:`check_count` with the number of image parts before fetching or decoding any (a
    request with one image too many is refused without work), then :meth:`add` each image.
    """

    def __init__(self, limits: MediaLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.count = 0
        self.total_bytes = 0
        self._lock = threading.Lock()

    def check_count(self, count: int, where: str = "") -> None:
        """Refuse a request that carries more than ``max_images`` images."""
        if count > self.limits.max_images:
            raise MediaError(_too_many(count, self.limits), where)

    def add(self, image: LoadedImage, where: str = "") -> None:
        """Count one more image of the request; refused if it passes a request limit."""
        with self._lock:
            count, total = self.count + 1, self.total_bytes + len(image.data)
            self.check_count(count, where)
            if total > self.limits.max_request_image_bytes:
                size, limit = _sizes(total, self.limits.max_request_image_bytes)
                raise MediaError(
                    f"the request's images total {size}; the limit is {limit} per request "
                    f"({LIMIT_VARIABLES['max_request_image_bytes']})",
                    where,
                )
            self.count, self.total_bytes = count, total


def _too_many(count: int, limits: MediaLimits) -> str:
    return (
        f"the request has {count} images; the limit is {limits.max_images} per request "
        f"({LIMIT_VARIABLES['max_images']})"
    )


# --- checks on bytes -----------------------------------------------------------------------------


def _check_size(size: int, limits: MediaLimits, where: str) -> None:
    if size == 0:
        raise MediaError("image is empty", where)
    if size > limits.max_image_bytes:
        actual, limit = _sizes(size, limits.max_image_bytes)
        raise MediaError(
            f"image is {actual}; the limit is {limit} per image "
            f"({LIMIT_VARIABLES['max_image_bytes']})",
            where,
        )


def _pixel_limit(limits: MediaLimits) -> tuple[int, str]:
    """Ours, or Pillow's process-wide bound where that is lower: so Pillow never warns about an
    image that is then accepted (its DecompressionBombWarning always ends in a refusal here)."""
    pillow = Image.MAX_IMAGE_PIXELS
    if pillow is not None and pillow < limits.max_image_pixels:
        return int(pillow), "PIL.Image.MAX_IMAGE_PIXELS"
    return limits.max_image_pixels, LIMIT_VARIABLES["max_image_pixels"]


@contextlib.contextmanager
def _opened(data: bytes, limits: MediaLimits, where: str) -> Iterator[ImageFile.ImageFile]:
    """The image with only its header read, checked: an allowed format and a pixel count within
    the bound. Pillow is told to try only the allowed formats' parsers."""
    limit, variable = _pixel_limit(limits)
    try:
        image = Image.open(io.BytesIO(data), formats=_PILLOW_FORMATS)
    except Image.UnidentifiedImageError:
        raise MediaError(_unidentified(data), where) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError(_bomb(limit, variable), where) from None
    except Exception as error:  # Pillow's parsers raise many types on malformed headers
        raise MediaError(_unidentified(data), where) from error
    try:
        width, height = image.size
        if image.format not in _PILLOW_FORMATS or width < 1 or height < 1:
            raise MediaError(_unidentified(data), where)
        if width * height > limit:
            raise MediaError(
                f"image is {width}x{height} = {width * height:,} pixels; the limit is "
                f"{limit:,} pixels per image ({variable})",
                where,
            )
        yield image
    finally:
        image.close()


def _load(image: ImageFile.ImageFile, limits: MediaLimits, where: str) -> None:
    """Decode all of the (first frame's) pixels: proves the file is whole."""
    try:
        image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError(_bomb(*_pixel_limit(limits)), where) from None
    except Exception as error:  # as in _opened: truncation is an OSError, other damage varies
        raise MediaError(f"{_format(image)} data is truncated or corrupt", where) from error


def _bomb(limit: int, variable: str) -> str:
    return (
        f"image has too many pixels (a possible decompression bomb); the limit is {limit:,} "
        f"pixels per image ({variable})"
    )


def _format(image: Image.Image) -> str:
    # A JPEG with extra pictures (MPO: phone cameras, depth maps) is a JPEG whose first picture
    # is what a model sees.
    return "JPEG" if image.format == "MPO" else str(image.format)


def _unidentified(data: bytes) -> str:
    for signature, name in _ALLOWED_SIGNATURES:
        if data.startswith(signature) and (name != "WEBP" or data[8:12] == b"WEBP"):
            return f"{name} data is truncated or corrupt"
    name = _sniff(data)
    if name:
        return f"image format {name} is not supported: send {_FORMATS_TEXT}"
    return f"data is not a {_FORMATS_TEXT} image"


def _sniff(data: bytes) -> str | None:
    for signature, name in _OTHER_SIGNATURES:
        if data.startswith(signature):
            return name
    if data[4:8] == b"ftyp":
        return _ISO_BRANDS.get(data[8:12])
    if data[:1024].lstrip()[:5].lower() in (b"<?xml", b"<svg ", b"<svg>"):
        return "SVG"
    return None


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation (1 to 8; 1 when absent or unreadable: the pixels as stored)."""
    try:
        value = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # malformed EXIF is common and harmless: ignore it, as decode does
        return 1
    return value if isinstance(value, int) and value in _TRANSPOSES else 1


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB, always a new image. Transparent pixels become white, not the black or garbage color
    a plain convert would leave under them."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit gray PNG: Pillow would clip
        return image.convert("I").point(lambda value: value / 256).convert("RGB")
    transparent = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info
    if not transparent:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    background = Image.new("RGB", rgba.size, (255, 255, 255))
    background.paste(rgba, mask=rgba.getchannel("A"))
    return background


def _sizes(size: int, limit: int) -> tuple[str, str]:
    """Both sizes in readable units, in exact bytes where rounding would make them look equal."""
    actual, bound = _size_text(size), _size_text(limit)
    if actual == bound:
        return f"{size:,} bytes", f"{limit:,} bytes"
    return actual, bound


def _size_text(size: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size} bytes"


def _normal_host(host: str) -> str:
    """Hostnames compare lowercased, without a trailing dot, non-ASCII ones in IDNA form."""
    host = host.strip().lower().removesuffix(".")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            pass  # left as it is: it matches no listed host and cannot be resolved
    return host


# --- fetching ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str  # normalized: what Host, SNI and the certificate check use
    port: int
    path: str  # with the query; never the fragment


def _fetch(
    url: str,
    limits: MediaLimits,
    where: str,
    resolve: Resolver,
    address_allowed: AddressCheck,
    tls_context: ssl.SSLContext | None,
) -> bytes:
    """The body of an http(s) URL, every hop checked before it is contacted; one deadline for
    all of it (resolving, connecting, TLS, headers, body, redirects)."""
    deadline = time.monotonic() + limits.fetch_timeout_s
    for _ in range(limits.max_redirects + 1):
        target = _check_url(url, limits, where)
        addresses = _checked_addresses(target, deadline, resolve, address_allowed, limits, where)
        status, location, body = _get(target, addresses, deadline, tls_context, limits, where)
        if status not in _REDIRECTS:
            return body
        if not location:
            raise MediaError(f"image URL answered HTTP {status} without a Location", where)
        url = urljoin(url, location.strip())
    raise MediaError(
        f"image URL redirects more than {limits.max_redirects} times "
        f"({LIMIT_VARIABLES['max_redirects']})",
        where,
    )


def _check_url(url: str, limits: MediaLimits, where: str) -> _Target:
    """Scheme, then whether remote images are on, then the host list: nothing is resolved or
    contacted for a URL that fails any of them."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise MediaError("image URL is malformed", where) from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise MediaError(
            f"image URL scheme {scheme + ':' if scheme else '(none)'} is not supported: send a "
            "data: URI (data:image/png;base64,...) or an http(s) URL",
            where,
        )
    if not limits.allowed_domains:
        raise MediaError(
            "remote image URLs are off on this server: send the image as a data: URI "
            "(data:image/png;base64,...), or have the operator list the host in "
            f"{LIMIT_VARIABLES['allowed_domains']}",
            where,
        )
    if parts.username is not None or parts.password is not None:
        raise MediaError("image URL carries credentials (user@host): remove them", where)
    host = _normal_host(parts.hostname or "")
    if not host:
        raise MediaError("image URL has no host", where)
    if host not in limits.allowed_domains:
        raise MediaError(
            f"image URL host {host!r} is not allowed: images are fetched only from the hosts "
            f"in {LIMIT_VARIABLES['allowed_domains']}",
            where,
        )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def _checked_addresses(
    target: _Target,
    deadline: float,
    resolve: Resolver,
    address_allowed: AddressCheck,
    limits: MediaLimits,
    where: str,
) -> list[str]:
    """Every address the host resolves to, each one allowed; one refused address refuses the
    host (a name that also points inside the network is not fetched from at all)."""
    try:
        found = _before_deadline(lambda: list(resolve(target.host, target.port)), deadline)
    except TimeoutError:
        raise MediaError(_timed_out(limits), where) from None
    except (OSError, UnicodeError):
        found = []
    if not found:
        raise MediaError(f"image URL host {target.host!r} cannot be resolved", where)
    addresses = []
    for text in found:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            raise MediaError(f"image URL host {target.host!r} cannot be resolved", where) from None
        # The address itself stays out of the message: it may describe the server's network.
        if not address_allowed(address):
            raise MediaError(
                f"image URL host {target.host!r} resolves to a non-public address; images are "
                "fetched only from the public internet",
                where,
            )
        addresses.append(str(text))
    return addresses


def _get(
    target: _Target,
    addresses: list[str],
    deadline: float,
    tls_context: ssl.SSLContext | None,
    limits: MediaLimits,
    where: str,
) -> tuple[int, str | None, bytes]:
    """One GET: (status, Location of a redirect, body of a 2xx answer)."""
    connection = _PinnedConnection(target, addresses, deadline, tls_context)
    try:
        connection.request("GET", target.path, headers=_REQUEST_HEADERS)
        response = connection.getresponse()
        if response.status in _REDIRECTS:
            return response.status, response.getheader("Location"), b""
        if not 200 <= response.status < 300:
            raise MediaError(f"image URL answered HTTP {response.status}", where)
        length = (response.getheader("Content-Length") or "").strip()
        if length.isascii() and length.isdigit() and int(length) > limits.max_image_bytes:
            size, limit = _sizes(int(length), limits.max_image_bytes)
            raise MediaError(
                f"image URL's body is {size}; the limit is {limit} per image "
                f"({LIMIT_VARIABLES['max_image_bytes']})",
                where,
            )
        return response.status, None, _read_body(response, limits, where)
    except MediaError:
        raise
    except TimeoutError:
        raise MediaError(_timed_out(limits), where) from None
    except ssl.SSLError as error:
        reason = getattr(error, "verify_message", None) or error.reason or type(error).__name__
        raise MediaError(f"image URL's TLS connection failed: {reason}", where) from None
    # http.client raises ValueError too, e.g. on a malformed chunk size.
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise MediaError(f"image URL cannot be fetched: {_reason(error)}", where) from None
    finally:
        connection.close()


_REQUEST_HEADERS = {
    "User-Agent": _USER_AGENT,
    "Accept": ", ".join(MEDIA_TYPES.values()),
    "Accept-Encoding": "identity",  # http.client does not decompress; sizes stay honest
    "Connection": "close",
}


def _read_body(response: http.client.HTTPResponse, limits: MediaLimits, where: str) -> bytes:
    """The body in chunks, stopped as soon as it passes the bound (a missing or lying
    Content-Length changes nothing)."""
    chunks: list[bytes] = []
    received = 0
    while chunk := response.read1(_CHUNK):
        received += len(chunk)
        if received > limits.max_image_bytes:
            raise MediaError(
                f"image URL's body is over {_size_text(limits.max_image_bytes)}, the limit per "
                f"image ({LIMIT_VARIABLES['max_image_bytes']})",
                where,
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _timed_out(limits: MediaLimits) -> str:
    return (
        f"image URL was not fetched within {limits.fetch_timeout_s:g} s "
        f"({LIMIT_VARIABLES['fetch_timeout_s']})"
    )


def _reason(error: Exception) -> str:
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _before_deadline(work: Callable[[], list[str]], deadline: float) -> list[str]:
    """Blocking work with no timeout of its own (getaddrinfo), given up at the deadline. Its
    thread is a daemon: a resolver that hangs ends by itself and never holds the process."""
    outcome: list[list[str] | BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # handed to the caller's thread below
            outcome.append(error)

    thread = threading.Thread(target=run, name="media-resolve", daemon=True)
    thread.start()
    thread.join(max(deadline - time.monotonic(), 0.0))
    if not outcome:
        raise TimeoutError
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


class _PinnedConnection(http.client.HTTPConnection):
    """HTTP or HTTPS to addresses checked beforehand, never to what the hostname resolves to
    later; the Host header, TLS SNI and the certificate check still use the hostname. Every
    read waits at most until the one deadline."""

    def __init__(
        self,
        target: _Target,
        addresses: list[str],
        deadline: float,
        tls_context: ssl.SSLContext | None,
    ) -> None:
        super().__init__(target.host, target.port, timeout=max(deadline - time.monotonic(), 0))
        self._addresses = addresses
        self._deadline = deadline
        self._tls: ssl.SSLContext | None = None
        if target.scheme == "https":
            self._tls = tls_context or ssl.create_default_context()
            self.default_port = 443  # so the Host header leaves the port out, as for http and 80
        # http.client builds the response as response_class(sock, method=...); this makes it
        # read through the deadline.
        self.response_class = self._response  # type: ignore[assignment]

    def connect(self) -> None:
        failure: OSError = OSError("no address to connect to")
        for address in self._addresses:
            try:
                sock = socket.create_connection((address, self.port), self._remaining())
                break
            except TimeoutError:
                raise
            except OSError as error:  # refused or unreachable: try the host's next address
                failure = error
        else:
            raise failure
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock.settimeout(self._remaining())
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def _remaining(self) -> float:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    def _response(self, sock: socket.socket, **kwargs: object) -> http.client.HTTPResponse:
        return http.client.HTTPResponse(_DeadlineSocket(sock, self._remaining), **kwargs)  # type: ignore[arg-type]


class _DeadlineSocket:
    """What http.client's response reads from: the socket, each receive bounded by the time
    left, so a server that trickles bytes cannot stretch the fetch past the deadline."""

    def __init__(self, sock: socket.socket, remaining: Callable[[], float]) -> None:
        self._sock = sock
        self._remaining = remaining

    def makefile(self, mode: str) -> io.BufferedReader:
        # The socket's own raw file counts as a reference: the connection may close its socket
        # once the response holds it (it does when the server closes after the body).
        raw = self._sock.makefile("rb", buffering=0)
        return io.BufferedReader(_DeadlineReader(self._sock, raw, self._remaining))


class _DeadlineReader(io.RawIOBase):
    def __init__(
        self, sock: socket.socket, raw: io.RawIOBase, remaining: Callable[[], float]
    ) -> None:
        self._sock = sock
        self._raw = raw
        self._remaining = remaining

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int | None:  # type: ignore[override]
        self._sock.settimeout(self._remaining())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()
