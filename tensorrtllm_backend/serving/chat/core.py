"""The chat core: a chat request prepared for the engine, whichever API it came from.

Preparing a conversation: the model's chat template (tools and tool results included), the tool
plan (which calls are allowed, the guide of a forced call, the parser of the model's format), the
output constraint (response_format, guided_*), the reasoning plan (how the answer begins for a
model that thinks, the guide kept off the thinking), then the engine's checks
(:meth:`Generator.admit`). Every refusal is a :class:`RequestError` naming the chat field; an API
that built the chat request from its own fields names its own (:meth:`ChatCore.prepare`'s
`fields`).
"""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import ValidationError

from ...common.guides import GuideError
from ...common.media import LoadedImage
from ..errors import validation_message
from ..generation import Generator, PreparedRequest
from ..ids import new_request_id
from ..offload import INLINE_MAX_CHARS
from ..request_errors import RequestError
from ..schemas import MAX_RETURN_SEQUENCES, GuidedDecoding, SamplingParams
from .answer import ChatPlan, ReasoningPlan
from .images import ImagePrompt, ImageRef, Vision, first_image, image_refs
from .output_format import output_constraint
from .reasoning import REASONING_FORMATS, Opening, reasoning_format
from .reasoning_guides import guide_after_reasoning
from .request import ChatRequest, SamplingFields
from .tool_parsers import FORMATS, detect_format
from .tools import ToolPlan, history_message, plan_tools

# The share of max_tokens the thinking may take at each reasoning effort (no cap above these).
EFFORT_BUDGET_SHARE = {"none": 0.0, "minimal": 0.125, "low": 0.25, "medium": 0.5}
DEFAULT_TEMPERATURE = 1.0  # OpenAI's and Anthropic's: a request without one samples
OFF_LOOP = INLINE_MAX_CHARS + 1  # an offloader size that always runs off the event loop
CHAT_MAX_TOKENS_CAP = 4096  # chat without max_tokens: the engine's room, at most this
# The fields of the engine's length checks: their refusals are OpenAI's context_length_exceeded.
_CONTEXT_PARAMS = ("prompt", "max_tokens")


def check_parser_names(tool_parser: str | None, reasoning_parser: str | None) -> None:
    """A ValueError naming the choices when a configured parser is not in its registry."""
    for variable, name, registry in (
        ("TRTLLM_TOOL_PARSER", tool_parser, FORMATS),
        ("TRTLLM_REASONING_PARSER", reasoning_parser, REASONING_FORMATS),
    ):
        if name is not None and name != "none" and name not in registry:
            choices = ", ".join([*registry, "none"])
            raise ValueError(f"{variable}={name!r} is not a known format: use one of {choices}")


def named(param: str | None, fields: dict[str, str]) -> str | None:
    """The field of an API that a chat field named in an error came from (`fields`: chat
    field -> the API's)."""
    if param is None:
        return None
    head, dot, rest = param.partition(".")
    return fields.get(head, head) + dot + rest


def chat_request(values: dict[str, Any], fields: dict[str, str]) -> ChatRequest:
    """The chat request of an API's values (None values left out); a 400 naming the API's
    field (`fields`: chat field -> the API's)."""
    try:
        return ChatRequest.model_validate(
            {name: value for name, value in values.items() if value is not None}
        )
    except ValidationError as error:
        message, location = validation_message(error)
        raise RequestError(message, param=named(location, fields)) from None


class ChatCore:
    """Validates chat requests against the served model and prepares them for the generator."""

    def __init__(
        self,
        generator: Generator,
        model_name: str,
        stream_interval: int = 1,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        quantization: dict[str, Any] | None = None,
        vision: Vision | None = None,
        images_unsupported: str = "this model does not take images: send text only",
    ) -> None:
        """`tool_parser`: the model's tool-call format by name (TRTLLM_TOOL_PARSER); None: read
        from its chat template; "none": no tool calls are parsed. `reasoning_parser` likewise
        names how the model marks its thinking (TRTLLM_REASONING_PARSER). `stream_interval`: SSE
        events per HTTP message after the first. `vision`: the model's image side (None: it
        takes no images, and a request with one is refused with `images_unsupported`)."""
        self.generator = generator
        self.model_name = model_name
        self.stream_interval = stream_interval
        self.quantization = quantization  # as packed: shown in /v1/models
        self.vision = vision
        self.images_unsupported = images_unsupported
        template = getattr(generator.tokenizer, "chat_template", None)
        texts = template.values() if isinstance(template, dict) else [template or ""]
        self.template_renders_tools = any("tools" in text for text in texts)
        if tool_parser is None:
            self.tool_format = detect_format(template)
        else:
            self.tool_format = None if tool_parser == "none" else FORMATS[tool_parser]
        self.reasoning_format = reasoning_format(reasoning_parser, template)

    # -- the served model --------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        """Tokens of a text as the model sees it (no special tokens added)."""
        return len(self.generator.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def model_names(self) -> list[str]:
        """The base model, then its LoRA adapters (a request names one as its `model`)."""
        return [self.model_name, *self.generator.loras.names()]

    def unknown_model(self, name: str) -> RequestError:
        """The 404 for a model name this server does not serve."""
        return RequestError(
            f"model {name!r} does not exist here; this server serves "
            f"{', '.join(repr(n) for n in self.model_names())} (GET /v1/models)",
            404, "model", "invalid_request_error", "model_not_found",
        )  # fmt: skip

    def _lora(self, model: str) -> str | None:
        """The adapter a request's `model` names (None for the base model)."""
        if model == self.model_name:
            return None
        if model in self.generator.loras.names():
            return model
        raise self.unknown_model(model)

    # -- requests of any API ---------------------------------------------------------------
    def sampling(
        self,
        request: SamplingFields,
        want_log_probs: bool,
        guide: GuidedDecoding | None = None,
        top_log_probs: int = 0,
        default_max_tokens: int | None = None,
    ) -> SamplingParams:
        """The core sampling parameters of a request's fields."""
        if request.n > MAX_RETURN_SEQUENCES:
            raise RequestError(
                f"n is at most {MAX_RETURN_SEQUENCES} here: send several requests", param="n"
            )
        temperature = request.temperature
        fields: dict[str, Any] = {
            "temperature": DEFAULT_TEMPERATURE if temperature is None else temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "repetition_penalty": request.repetition_penalty,
            "min_tokens": request.min_tokens,
            # Without a seed every request samples afresh (TensorRT-LLM's default seed is 0,
            # which would give every unseeded request the same text).
            "seed": request.seed if request.seed is not None else secrets.randbits(63),
            "stop": request.stop or [],
            "return_log_probs": want_log_probs,
            "top_log_probs": top_log_probs,
            "ignore_eos": request.ignore_eos,
            "num_return_sequences": request.n,
            "guided_decoding": guide,
            "max_tokens": request.max_completion_tokens or request.max_tokens or default_max_tokens,
        }
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})

    async def admit(
        self,
        request: SamplingFields,
        prompt: str,
        params: SamplingParams,
        guide_param: str | None,
        api: str,
        size: int,
        top_param: str = "top_logprobs",
        **options: Any,
    ) -> PreparedRequest:
        """The core request (`options`: more arguments of :meth:`Generator.admit`; `size`: the
        request body's bytes, which decide whether it is prepared off the event loop). A guide
        the engine could not enforce is a 400 quoting the compiler, before Triton sees the
        request; every refusal names the request's field: `guide_param` for the guide,
        `top_param` for the alternatives asked for."""
        lora = self._lora(request.model)
        try:
            return await self.generator.admit(
                prompt, params, new_request_id(), size=max(size, len(prompt)), api=api,
                lora=lora, **options,
            )  # fmt: skip
        except RequestError as error:
            if error.param in _CONTEXT_PARAMS and error.code is None:
                error.code = "context_length_exceeded"
            elif error.param == "top_log_probs":
                error.param = top_param
            elif guide_param and error.param and error.param.startswith("guided_decoding"):
                error.param = guide_param
            raise

    # -- chat --------------------------------------------------------------------------------
    def render(self, request: ChatRequest, plan: ToolPlan | None = None) -> str:
        """The prompt of a chat request, by the model's chat template (blocking, in proportion
        to the messages and tools: :meth:`prepare` runs it off the loop when large);
        `chat_template_kwargs` (e.g. enable_thinking) are the template's own variables.

        The messages' own faults (a content part that is not text, tool-call arguments that are
        not JSON) and the template's refusals (jinja2's raise_exception: "roles must
        alternate"...) are the client's, a 400; anything else, a broken template included, is a
        server error."""
        tokenizer = self.generator.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise RequestError(
                "this model's tokenizer has no chat template: use /v1/completions, or pack the "
                "model with a tokenizer whose tokenizer_config.json has a chat_template",
                param="messages",
            )
        tools = plan.template_tools() if plan is not None else None
        try:
            images = self.vision is not None
            messages = [history_message(m, images) for m in request.messages]
        except ValueError as error:
            raise RequestError(str(error), param="messages") from None
        import jinja2

        try:
            return str(
                tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    tokenize=False,
                    add_generation_prompt=request.add_generation_prompt,
                    **(request.chat_template_kwargs or {}),
                )
            )
        except jinja2.TemplateSyntaxError:
            raise  # the model's template is broken: not the client's to fix
        except jinja2.TemplateError as error:
            raise RequestError(
                f"the chat template rejected the messages: {error}", param="messages"
            ) from None

    def plan_tools(self, request: ChatRequest) -> ToolPlan:
        """How the request's tools are used (a 400 for a combination that cannot be served)."""
        return plan_tools(request, self.tool_format, self.template_renders_tools)

    def prompt_tokens(self, request: ChatRequest) -> int:
        """The tokens of a chat request's prompt, its images' included (blocking). The images
        are read first: a model that takes none refuses them as :meth:`prepare` does."""
        images = self.load_images(request)
        prompt = self.render(request, self.plan_tools(request))
        if images:
            assert self.vision is not None
            return len(self.vision.prompt_ids(prompt, images).expanded)
        return self.count_tokens(prompt)

    async def prompt_images(
        self, prompt: str, urls: list[str]
    ) -> tuple[ImagePrompt, list[LoadedImage]]:
        """A text prompt's images (the native API's `images`), read and placed: the prompt's
        token ids (each image token the prompt holds expanded, and as written) and the
        images."""
        refs = [ImageRef(f"images[{i}]", url) for i, url in enumerate(urls)]
        if self.vision is None:
            raise RequestError(self.images_unsupported, param="images")
        vision = self.vision
        images = await self.generator.offloader.run(OFF_LOOP, vision.load, refs)
        ids = await self.generator.offloader.run(
            OFF_LOOP, vision.prompt_ids, prompt, images, "prompt"
        )
        return ids, images

    def load_images(self, request: ChatRequest) -> list[LoadedImage]:
        """The request's images, read and checked (blocking); a 400 naming the first image part
        when this model takes none."""
        if self.vision is None:
            where = first_image(request.messages)
            if where is not None:
                raise RequestError(f"{where}: {self.images_unsupported}", param=where)
            return []
        refs = image_refs(request.messages)
        return self.vision.load(refs) if refs else []

    async def prepare(
        self,
        request: ChatRequest,
        size: int = 0,
        api: str = "openai_chat",
        fields: dict[str, str] | None = None,
    ) -> tuple[PreparedRequest, ChatPlan]:
        """The core request and the plan its answer is read back with (tools, reasoning);
        `size`: the request body's bytes (a large request's tools and template are handled off
        the event loop); `api`: the metrics label of the API the request came from; `fields`:
        chat field -> the API's, for the fields its errors name."""
        try:
            return await self._prepare(request, size, api)
        except RequestError as error:
            error.param = named(error.param, fields or {})
            raise

    async def _prepare(
        self, request: ChatRequest, size: int, api: str
    ) -> tuple[PreparedRequest, ChatPlan]:
        if request.top_logprobs is not None and not request.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        plan = await self.generator.offloader.run(size, self.plan_tools, request)
        constraint = output_constraint(request)
        guide, guide_param = (constraint.guide, constraint.param) if constraint else (None, None)
        if plan.guide is not None:
            if constraint is not None:
                raise RequestError(
                    f"tool_choice {plan.mode!r} constrains the answer to a tool call, so it "
                    f"cannot be combined with {constraint.param}",
                    param=constraint.param,
                )
            guide, guide_param = plan.guide, "tools"
        elif constraint is not None and plan.parses_calls:
            plan = ToolPlan("none", plan.tools)  # the answer follows the requested format
        images: list[LoadedImage] = []
        if first_image(request.messages) is not None:  # read off the loop, whatever the size
            images = await self.generator.offloader.run(OFF_LOOP, self.load_images, request)
        prompt = await self.generator.offloader.run(size, self.render, request, plan)
        ids = None
        if images:
            assert self.vision is not None
            ids = await self.generator.offloader.run(
                OFF_LOOP, self.vision.prompt_ids, prompt, images
            )
        reasoning = self._reasoning(prompt)
        if (
            guide is not None
            and reasoning is not None
            and self.generator.guides_unsupported is None
        ):
            guide = _guide_after_reasoning(guide, reasoning, guide_param)
        params = self.sampling(request, request.logprobs, guide, request.top_logprobs or 0)
        # The template already holds the special tokens (BOS) the model expects.
        prepared = await self.admit(
            request, prompt, params, guide_param, api, size,
            add_special_tokens=False, max_tokens_cap=CHAT_MAX_TOKENS_CAP, images=images,
            token_ids=ids.expanded if ids else None, written_ids=ids.written if ids else None,
        )  # fmt: skip
        budget = None
        if reasoning is not None and reasoning.opening is not Opening.CONTENT and guide is None:
            budget = thinking_budget(request, prepared.params.max_tokens)
        return prepared, ChatPlan(plan, reasoning, budget)

    def _reasoning(self, prompt: str) -> ReasoningPlan | None:
        """How the answer to a rendered chat begins, for a model that thinks."""
        if self.reasoning_format is None:
            return None
        return ReasoningPlan(self.reasoning_format, self.reasoning_format.opening(prompt))


def thinking_budget(request: ChatRequest, max_tokens: int) -> int | None:
    """The thinking's cap: the request's own, else its reasoning effort's share of max_tokens
    (the template's `reasoning_effort` variable; none at high effort or above). A cap that
    leaves the whole of max_tokens is none. Not with a guide: its grammar already decides where
    the thinking ends."""
    budget = request.thinking_budget
    effort = (request.chat_template_kwargs or {}).get("reasoning_effort")
    if budget is None and effort in EFFORT_BUDGET_SHARE:
        budget = int(max_tokens * EFFORT_BUDGET_SHARE[effort])
    if budget is None or budget >= max_tokens:
        return None
    return max(0, budget)


def _guide_after_reasoning(
    guide: GuidedDecoding, reasoning: ReasoningPlan, param: str | None
) -> GuidedDecoding:
    """The request's guide enforced on the answer only, after the thinking."""
    try:
        return guide_after_reasoning(guide, reasoning.fmt, reasoning.opening)
    except GuideError as error:
        raise RequestError(str(error), param=param) from None
