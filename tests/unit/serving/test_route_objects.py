"""Route objects: one per way through Triton, each with its model, its own refusals, its tensors
and its decoders; the engine interface the request path streams through; and the one
RequestError every service-side refusal is."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from tensorrtllm_backend.common.engine_api import InferenceEngine
from tensorrtllm_backend.packing.demo import BOS, EOS, PAD, train_tokenizer
from tensorrtllm_backend.serving.chat.tools import plan_tools
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.serving.openai_api.protocol import ChatCompletionRequest
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.schemas import FinishReason, GuidedDecoding, SamplingParams
from tensorrtllm_backend.serving.triton_paths import ROUTE_MODELS, Route, make_route
from tensorrtllm_backend.triton.client import TritonLLMClient

LIMITS = EngineLimits(max_input_len=64, max_seq_len=512, max_beam_width=1, max_batch_size=4)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
    )


@pytest.mark.parametrize("route", list(Route))
def test_each_route_has_an_object_calling_its_model(route: Route, tokenizer) -> None:
    path = make_route(route, tokenizer)
    assert path.route is route
    assert path.model_name == ROUTE_MODELS[route]


@pytest.mark.parametrize("route", list(Route))
async def test_the_generator_asks_its_route_for_the_tensors(route: Route, tokenizer) -> None:
    client = TritonLLMClient("127.0.0.1:1")
    generator = Generator(client, tokenizer, LIMITS, route=route)
    prepared = generator.prepare("The fox", SamplingParams(max_tokens=3))
    tensors, outputs = generator._triton_inputs(prepared, False)
    expected_tensors, expected_outputs = make_route(route, tokenizer).inputs(prepared, None)
    assert generator.model_name == ROUTE_MODELS[route]
    assert sorted(tensors) == sorted(expected_tensors)
    assert outputs == list(expected_outputs)
    await client.close()


@pytest.mark.parametrize("route", list(Route))
@pytest.mark.parametrize(("generated", "reason"), [(5, FinishReason.LENGTH), (4, None)])
def test_engine_routes_end_for_length_at_max_tokens(
    route: Route, generated: int, reason: FinishReason | None, tokenizer
) -> None:
    decoder = make_route(route, tokenizer).decoder(SamplingParams(max_tokens=5))
    assert decoder.finish(5, generated) == (0, reason)


def test_the_direct_route_needs_an_end_token(tokenizer) -> None:
    without_eos = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer())
    path = make_route(Route.DIRECT, without_eos)
    with pytest.raises(RequestError, match="pass end_id") as caught:
        path.check_prepared(SamplingParams())
    assert caught.value.param == "end_id"
    path.check_prepared(SamplingParams(end_id=2))
    make_route(Route.BLS, without_eos).check_prepared(SamplingParams())  # the model ends it


def test_only_the_ensemble_returns_one_sequence(tokenizer) -> None:
    single = {route: make_route(route, tokenizer).single_sequence for route in Route}
    assert single[Route.ENSEMBLE] is not None and "sequence_index" in single[Route.ENSEMBLE]
    assert single[Route.DIRECT] is single[Route.BLS] is single[Route.LLMAPI] is None


def test_the_token_id_routes_share_one_decoder(tokenizer) -> None:
    params = SamplingParams(return_log_probs=True, top_log_probs=2)
    direct = make_route(Route.DIRECT, tokenizer).decoder(params)
    assert type(make_route(Route.LLMAPI, tokenizer).decoder(params)) is type(direct)


async def test_the_grpc_client_is_an_inference_engine() -> None:
    assert isinstance(TritonLLMClient("127.0.0.1:1"), InferenceEngine)


def _top_log_probs_refusal(tokenizer) -> None:
    generator = Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS, route=Route.BLS)
    generator.prepare("The fox", SamplingParams(return_log_probs=True, top_log_probs=2))


def _guide_refusal(tokenizer) -> None:
    """The guide checks live in common/ (the engine runs them too); the generator answers them."""
    generator = Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS)
    generator.prepare("The fox", SamplingParams(guided_decoding=GuidedDecoding(type="regex")))


def _tool_refusal(tokenizer) -> None:
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}
    )
    plan_tools(request, None, True)


@pytest.mark.parametrize(
    ("refuse", "param"),
    [
        (_top_log_probs_refusal, "top_log_probs"),
        (_guide_refusal, "guided_decoding"),
        (_tool_refusal, "tool_choice"),
    ],
)
async def test_service_side_refusals_are_request_errors(refuse, param: str, tokenizer) -> None:
    with pytest.raises(RequestError) as caught:
        refuse(tokenizer)
    assert caught.value.status == 400
    assert caught.value.param == param
