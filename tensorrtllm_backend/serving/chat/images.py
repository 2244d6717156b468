"""A chat request's images: found in its messages' content parts, loaded within the limits
(common/media.py), and placed in the prompt by the model's own processor.

Every API brings its images to the chat core as OpenAI's `image_url` parts (Anthropic's image
blocks and the Responses API's `input_image` are converted to them), in any message: a tool
message holds the images of a tool result (a screenshot, an image file read), where they stand
among its text. The chat template sees an `{"type": "image"}` part where each image stands, as
Hugging Face processors' templates expect; the processor then expands each image's placeholder
into the tokens the model sees for it, so the prompt's token count (usage, the engine's limits)
includes the image's tokens. A template that renders a message's content as a string only (some
do so for tool messages) places no image there: the request is refused (the placeholders do not
match the images) rather than the image moved elsewhere.

Errors name an image by its place in the chat messages (`messages[1].content[0]`), or by the one
its API gave the part (`WHERE`): the messages of the Anthropic and Responses APIs are not the chat
messages one for one (a user turn's tool results are messages of their own, function calls join
one assistant message), so each names its images itself (`messages.3.content.0.content.1`,
`input[2].output[1]`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...common.media import ImageBudget, LoadedImage, MediaError, MediaLimits, image_from_url
from ...settings import Settings
from ..request_errors import RequestError

IMAGE_PART = "image_url"  # the one image part type the chat core reads
WHERE = "where"  # an image part's place in the request of its API, where that API names it


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image part of a request: where it stands (for errors) and its URL (data: or http)."""

    where: str
    url: str


def media_limits(settings: Settings) -> MediaLimits:
    """The image limits the service's settings set."""
    domains = (settings.allowed_media_domains or "").split(",")  # MediaLimits normalizes them
    return MediaLimits(
        max_image_bytes=settings.max_image_bytes,
        max_request_image_bytes=settings.max_request_image_bytes,
        max_image_pixels=settings.max_image_pixels,
        max_images=settings.max_images_per_request,
        fetch_timeout_s=settings.media_fetch_timeout_s,
        max_redirects=settings.max_media_redirects,
        allowed_domains=tuple(d.strip() for d in domains if d.strip()),
    )


def image_part(url: str, where: str = "") -> dict[str, Any]:
    """The chat part of an image of another API (`where`: its place in that API's request)."""
    part: dict[str, Any] = {"type": IMAGE_PART, IMAGE_PART: {"url": url}}
    if where:
        part[WHERE] = where
    return part


def _where(part: dict[str, Any], m: int, p: int) -> str:
    named = part.get(WHERE)
    return named if isinstance(named, str) and named else f"messages[{m}].content[{p}]"


def first_image(messages: Sequence[Any]) -> str | None:
    """Where a conversation's first image part stands (None: it has none)."""
    for m, message in enumerate(messages):
        if isinstance(message.content, list):
            for p, part in enumerate(message.content):
                if part.get("type") == IMAGE_PART:
                    return _where(part, m, p)
    return None


def image_refs(messages: Sequence[Any]) -> list[ImageRef]:
    """The image parts of a conversation, in order (a 400 for one without a URL)."""
    found = []
    for m, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        for p, part in enumerate(message.content):
            if part.get("type") != IMAGE_PART:
                continue
            where = _where(part, m, p)
            image = part.get(IMAGE_PART)
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise RequestError(
                    'an image_url part needs {"image_url": {"url": "data:image/png;base64,..."}}',
                    param=f"{where}.image_url",
                )
            found.append(ImageRef(where, url))
    return found


def template_content(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A message's parts as the chat template takes them: text parts, and an image part where
    each image stands (its data stays out of the template)."""
    parts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == IMAGE_PART:
            parts.append({"type": "image"})
        else:
            raise ValueError(f"content parts of type {kind!r} are not supported")
    return parts


@dataclass(frozen=True, slots=True)
class ImagePrompt:
    """A prompt with images as token ids: `expanded`, what the model sees (each image's tokens;
    the prompt's length), and `written`, each image's placeholder once, as TensorRT-LLM's LLM
    API takes it (its input processor expands them)."""

    expanded: list[int]
    written: list[int]


class Vision:
    """The served model's image side: its processor and the limits images are read within."""

    def __init__(self, processor: Any, limits: MediaLimits, record: dict[str, Any]) -> None:
        self.processor = processor
        self.limits = limits
        self.image_token = str(record.get("image_token", ""))
        self.image_token_id = record.get("image_token_id")

    def load(self, refs: Sequence[ImageRef]) -> list[LoadedImage]:
        """Each image read and checked (blocking: fetching, decoding); the request's count is
        checked before any is read."""
        budget = ImageBudget(self.limits)
        images = []
        try:
            budget.check_count(
                len(refs), refs[min(len(refs), self.limits.max_images + 1) - 1].where
            )
            for ref in refs:
                image = image_from_url(ref.url, self.limits, where=ref.where)
                budget.add(image, ref.where)
                images.append(image)
        except MediaError as error:
            raise RequestError(str(error), param=error.where or None) from None
        return images

    def prompt_ids(
        self, prompt: str, images: Sequence[LoadedImage], param: str = "messages"
    ) -> ImagePrompt:
        """The prompt's token ids, with each image's placeholder expanded by the model's
        processor and as written (blocking). A chat prompt's template already wrote the special
        tokens; a text prompt (`param` "prompt") gets them as a completion's would."""
        found = prompt.count(self.image_token) if self.image_token else len(images)
        if found != len(images):
            where = "the chat template placed" if param == "messages" else "the prompt holds"
            raise RequestError(
                f"{where} {found} image placeholders ({self.image_token!r}) for {len(images)} "
                "images: put the image token where each image stands",
                param=param,
            )
        special = param != "messages"
        encoded = self.processor(
            text=[prompt], images=[image.decode() for image in images], add_special_tokens=special
        )
        written = self.processor.tokenizer.encode(prompt, add_special_tokens=special)
        return ImagePrompt([int(t) for t in encoded["input_ids"][0]], [int(t) for t in written])
