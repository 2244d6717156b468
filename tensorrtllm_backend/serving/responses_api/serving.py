"""OpenAI's Responses API over the chat core.

A request becomes the core's chat request (instructions as the system message, input items and
the stored conversation of `previous_response_id` as the messages, function tools, `text.format`
as response_format) and is prepared by :meth:`~..chat.core.ChatCore.prepare`: the same template,
tool plan, output constraint, reasoning plan and engine checks as every chat API. The core's
answer steps become output items (reasoning, message, tool calls), streamed as OpenAI's
events with sequence numbers or collected and rendered once (the request as a chat request:
:mod:`.conversion`). Responses are stored
(:mod:`.store`) unless `store` is false.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from ...common.engine_api import EngineError
from ..apis import RESPONSES_LABEL
from ..chat.answer import ChatPlan
from ..chat.core import ChatCore
from ..chat.stream import AnswerStep, answer_steps, collect
from ..chat.usage import TokenCount
from ..generation import PreparedRequest
from ..ids import new_id
from ..offload import INLINE_MAX_CHARS
from ..request_errors import RequestError
from ..schemas import FinishReason
from ..web.sse import named_event
from .client_tools import client_tools
from .conversion import (
    FIELDS,
    chat_request,
    custom_tools,
    namespaced,
    parse_items,
    stored_item,
)
from .output import Event, OutputBuilder
from .protocol import InputItem, ReasoningItem, ReasoningText, ResponsesRequest
from .sealing import ReasoningSeal, new_key
from .store import ResponseStore, StoredResponse
from .truncation import fitting_items


@dataclass
class ResponseRun:
    """One response being answered."""

    request: ResponsesRequest
    prepared: PreparedRequest
    plan: ChatPlan
    input_items: list[dict[str, Any]]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: float = field(default_factory=time.time)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    output: list[dict[str, Any]] = field(default_factory=list)  # the items so far
    stored_final: bool = False


class ResponsesServing:
    """`/v1/responses`: create (whole or streamed), retrieve, delete, cancel."""

    def __init__(
        self,
        core: ChatCore,
        store: ResponseStore,
        hosted_tools: str = "omit",
        seal: ReasoningSeal | None = None,
    ) -> None:
        """`hosted_tools`: what OpenAI-side tools get (TRTLLM_HOSTED_TOOLS: omit, reject);
        `seal`: the deployment's key for encrypted reasoning (one of its own when not given)."""
        self.core = core
        self.store = store
        self.hosted_tools = hosted_tools
        self.seal = seal or ReasoningSeal(new_key())

    async def prepare(self, request: ResponsesRequest, size: int = 0) -> ResponseRun:
        """The response to run (`size`: the request body's bytes)."""
        new_items = self._unsealed(parse_items(request.input))
        history: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            found = self.store.conversation(request.previous_response_id)
            if found is None:
                raise self._not_found(request.previous_response_id, "previous_response_id")
            history = found
        items = parse_items(history, "previous_response_id") + new_items
        if request.truncation == "auto":  # renders the prompt a few times: in the pool
            offloader = self.core.generator.offloader
            items = await offloader.run(INLINE_MAX_CHARS + 1, self._fitting, request, items)
        chat = chat_request(request, items, self.hosted_tools)
        prepared, plan = await self.core.prepare(chat, size, RESPONSES_LABEL, FIELDS)
        dumped = [stored_item(item) for item in new_items]
        run = ResponseRun(request, prepared, plan, dumped)
        if request.store and self.store.enabled:
            self._store(run, self.response(run, "in_progress", []), [])
        return run

    def _fitting(self, request: ResponsesRequest, items: list[InputItem]) -> list[InputItem]:
        return fitting_items(
            items, lambda kept: chat_request(request, kept, self.hosted_tools), self.core
        )

    def _unsealed(self, items: list[InputItem]) -> list[InputItem]:
        """Reasoning items sent back with their encrypted content hold its thinking (a blob
        this deployment did not seal, or one changed, is a 400)."""
        opened = list(items)
        for position, item in enumerate(items):
            if isinstance(item, ReasoningItem) and item.encrypted_content:
                try:
                    thinking = self.seal.open(item.encrypted_content)
                except ValueError as error:
                    where = f"input[{position}].encrypted_content"
                    raise RequestError(f"{where}: {error}", param=where) from None
                text = ReasoningText(type="reasoning_text", text=thinking)
                opened[position] = item.model_copy(update={"content": [text]})
        return opened

    def _builder(self, run: ResponseRun) -> OutputBuilder:
        request = run.request
        summary = request.reasoning is not None and request.reasoning.wants_summary()
        sealed = "reasoning.encrypted_content" in (request.include or ())
        seal = self.seal.seal if sealed else None
        tools = request.tools
        return OutputBuilder(
            run.output, namespaced(tools), summary, seal, custom_tools(tools), client_tools(tools)
        )

    def _not_found(self, response_id: str, param: str | None = None) -> RequestError:
        keeps = (
            f"responses are kept {self.store.ttl_s:g} s within {self.store.max_bytes} bytes, "
            "by the worker that made them"
            if self.store.enabled
            else "this server stores no responses (TRTLLM_RESPONSES_STORE_BYTES=0)"
        )
        return RequestError(
            f"response {response_id!r} not found ({keeps})", 404, param=param, code="not_found"
        )

    def _store(self, run: ResponseRun, response: dict[str, Any], output: list[dict]) -> None:
        entry = StoredResponse(
            response,
            run.input_items + output,
            run.request.previous_response_id,
            cancelled=run.cancelled if response["status"] == "in_progress" else None,
        )
        self.store.put(run.id, entry)

    async def _steps(self, run: ResponseRun) -> AsyncIterator[AnswerStep]:
        """The answer's steps; a response that does not finish is stored as what it has,
        failed (the engine) or cancelled (the client left)."""
        status: str | None = "cancelled"  # unless it finishes: the client left
        try:
            steps = answer_steps(self.core.generator, run.prepared, run.plan, run.cancelled)
            async with aclosing(steps) as each:
                async for step in each:
                    yield step
            status = None
        except Exception:
            status = "failed"
            raise
        finally:
            if status is not None and run.request.store and not run.stored_final:
                self._store(run, self.response(run, status, run.output), run.output)

    async def create(self, run: ResponseRun) -> dict[str, Any]:
        """The whole response: the answer's steps collected, rendered once."""
        answer = await collect(run.prepared, self._steps(run))
        (sequence,) = answer.sequences
        output = self._builder(run)
        output.status = _item_status(sequence.finish_reason)
        output.build(sequence.events)
        return self._finish(run, output, sequence.finish_reason, answer.usage)

    def _finish(
        self,
        run: ResponseRun,
        output: OutputBuilder,
        finish: FinishReason | None,
        usage: TokenCount,
    ) -> dict[str, Any]:
        status = _status(finish)
        response = self.response(run, status, output.items, usage, output.reasoning_text())
        if run.request.store:
            self._store(run, response, output.items)
        run.stored_final = True
        return response

    async def stream(self, run: ResponseRun) -> AsyncIterator[str]:
        """OpenAI's stream of events, each with its sequence number. The first events wait for
        the engine's first answer, so a failure before it still gets an error status."""
        numbers = itertools.count()
        output = self._builder(run)
        usage = TokenCount(len(run.prepared.prompt_ids))

        def started() -> list[Event]:
            snapshot = self.response(run, "in_progress", [])
            return [("response.created", {"response": snapshot}),
                    ("response.in_progress", {"response": snapshot})]  # fmt: skip

        def ended(last: AnswerStep) -> Iterator[Event]:
            yield from output.finish(_item_status(last.finish_reason))
            response = self._finish(run, output, last.finish_reason, usage)
            yield _FINAL_EVENTS[response["status"]], {"response": response}

        def failed(error: EngineError) -> list[Event]:
            response = self.response(run, "failed", output.items)
            response["error"] = {"code": "server_error", "message": str(error)}
            return [("error", {"code": "server_error", "message": str(error), "param": None}),
                    ("response.failed", {"response": response})]  # fmt: skip

        steps = self._steps(run)
        async for kind, payload in output.stream(steps, usage, started, ended, failed):
            yield named_event(kind, {"type": kind, "sequence_number": next(numbers), **payload})

    def response(
        self,
        run: ResponseRun,
        status: str,
        output: list[dict[str, Any]],
        usage: TokenCount | None = None,
        reasoning: str = "",
    ) -> dict[str, Any]:
        """The Response object in a given state."""
        request = run.request
        text_format = (
            request.text.format.model_dump(exclude_none=True, by_alias=True)
            if request.text and request.text.format
            else {"type": "text"}
        )
        response: dict[str, Any] = {
            "id": run.id,
            "object": "response",
            "created_at": run.created_at,
            "status": status,
            "model": self.core.model_name,
            "output": output,
            "instructions": request.instructions,
            "previous_response_id": request.previous_response_id,
            "max_output_tokens": request.max_output_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "tools": request.tools or [],
            "tool_choice": request.tool_choice or ("auto" if request.tools else "none"),
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "text": {"format": text_format},
            "truncation": "disabled",
            "store": request.store,
            "background": False,
            "reasoning": {
                "effort": request.reasoning.effort if request.reasoning else None,
                "summary": request.reasoning.summary if request.reasoning else None,
            },
            "metadata": request.metadata or {},
            "user": request.user,
            "error": None,
            "incomplete_details": None,
            "usage": None,
        }
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        if usage is not None:
            response["completed_at"] = time.time()
            response["usage"] = self._usage(usage, reasoning)
        return response

    def _usage(self, usage: TokenCount, reasoning: str) -> dict:
        output_tokens = usage.completion_tokens
        return {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": usage.cached_tokens,
                "cache_write_tokens": 0,
            },
            "output_tokens": output_tokens,
            "output_tokens_details": {
                "reasoning_tokens": min(self.core.count_tokens(reasoning), output_tokens)
            },
            "total_tokens": usage.total_tokens,
        }

    # -- stored responses ---------------------------------------------------------------------
    def retrieve(self, response_id: str) -> dict[str, Any]:
        entry = self.store.get(response_id)
        if entry is None:
            raise self._not_found(response_id)
        return entry.response

    def input_items(self, response_id: str) -> dict[str, Any]:
        """The items of the conversation the response answered (OpenAI's list object)."""
        entry = self.store.get(response_id)
        conversation = self.store.conversation(response_id)
        if entry is None or conversation is None:
            raise self._not_found(response_id)
        answered = conversation[: len(conversation) - len(entry.response["output"])]
        data = list(reversed(answered))
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": False,
        }

    def delete(self, response_id: str) -> dict[str, Any]:
        if not self.store.delete(response_id):
            raise self._not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def cancel(self, response_id: str) -> dict[str, Any]:
        """Stop a response in progress (it ends as cancelled); any other is a 400."""
        entry = self.store.get(response_id)
        if entry is None:
            raise self._not_found(response_id)
        if entry.cancelled is None:
            raise RequestError(
                f"response {response_id!r} is {entry.response['status']}: only a response in "
                "progress can be cancelled"
            )
        entry.cancelled.set()
        return {**entry.response, "status": "cancelled"}


# OpenAI's stream has no event of its own for a cancelled response: it ends incomplete.
_FINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "cancelled": "response.incomplete",
}


def _status(finish: FinishReason | None) -> str:
    if finish is FinishReason.LENGTH:
        return "incomplete"
    if finish is FinishReason.CANCELLED:
        return "cancelled"
    return "completed"


def _item_status(finish: FinishReason | None) -> str:
    return "completed" if _status(finish) == "completed" else "incomplete"
