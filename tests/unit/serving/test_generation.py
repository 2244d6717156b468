"""Generator.prepare (engine limits) and the Triton tensors a prepared request becomes.

prepare() never talks to Triton, so the client points at a closed port; the tokenizer is the demo
model's, trained locally.
"""

from __future__ import annotations

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from tensorrtllm_backend.packing.demo import BOS, EOS, PAD, train_tokenizer
from tensorrtllm_backend.serving.chat.stream import SequenceAnswer, WholeAnswer
from tensorrtllm_backend.serving.chat.usage import TokenCount
from tensorrtllm_backend.serving.generation import EngineLimits, Generator, PreparedRequest
from tensorrtllm_backend.serving.native_api.render import native_response
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.schemas import (
    FinishReason,
    SamplingParams,
)
from tensorrtllm_backend.serving.translation import engine_stop_words
from tensorrtllm_backend.serving.triton_paths import Route
from tensorrtllm_backend.serving.triton_paths.direct import direct_outputs
from tensorrtllm_backend.serving.triton_paths.text import text_outputs
from tensorrtllm_backend.triton.client import TritonLLMClient

LIMITS = EngineLimits(max_input_len=64, max_seq_len=512, max_beam_width=1, max_batch_size=4)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token=BOS, eos_token=EOS, pad_token=PAD
    )


@pytest.fixture(params=[Route.DIRECT, Route.BLS])
async def generator(request: pytest.FixtureRequest, tokenizer) -> Generator:
    client = TritonLLMClient("127.0.0.1:1")
    generator = Generator(client, tokenizer, LIMITS, route=request.param)
    yield generator
    await client.close()


def test_sequences_beyond_the_batch_size_are_refused(generator: Generator) -> None:
    with pytest.raises(RequestError, match="max_batch_size 4") as caught:
        generator.prepare("Once upon", SamplingParams(num_return_sequences=5))
    assert caught.value.param == "num_return_sequences" and caught.value.status == 400


async def test_ensemble_route_refuses_several_sequences(tokenizer) -> None:
    generator = Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS, route=Route.ENSEMBLE)
    with pytest.raises(RequestError, match="sequence_index"):
        generator.prepare("Once upon", SamplingParams(num_return_sequences=2))
    assert generator.prepare("Once upon", SamplingParams()).params.num_return_sequences == 1


async def test_sequences_with_beam_search_are_refused(tokenizer) -> None:
    limits = EngineLimits(64, 512, max_beam_width=4, max_batch_size=8)
    generator = Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, limits)
    with pytest.raises(RequestError, match="beam_width 1"):
        generator.prepare("Once upon", SamplingParams(num_return_sequences=2, beam_width=2))


def test_several_sequences_ask_for_their_index(generator: Generator) -> None:
    prepared = generator.prepare(
        "Once upon", SamplingParams(num_return_sequences=3, temperature=0.8, seed=7)
    )
    tensors, outputs = generator._triton_inputs(prepared, send_lora_weights=False)
    assert tensors["num_return_sequences"].tolist() == [[3]]
    assert tensors["num_return_sequences"].dtype == np.int32
    assert "sequence_index" in outputs


def test_one_sequence_sends_no_extra_tensor(generator: Generator) -> None:
    """Older engines have no num_return_sequences input: it is sent only when asked for."""
    prepared = generator.prepare("Once upon", SamplingParams())
    tensors, outputs = generator._triton_inputs(prepared, send_lora_weights=False)
    assert "num_return_sequences" not in tensors
    assert "sequence_index" not in outputs
    params = SamplingParams()
    assert "sequence_index" not in direct_outputs(params) + text_outputs(params)


def strings(ids: list[int]) -> list[str]:
    return [f"<{i}>" for i in ids]


def whole(
    sequences: list[SequenceAnswer], log_probs: bool = False, top: int = 0
) -> tuple[PreparedRequest, WholeAnswer]:
    params = SamplingParams(return_log_probs=log_probs, top_log_probs=top)
    usage = TokenCount(3, sum(sequence.token_count for sequence in sequences))
    return PreparedRequest("r", "p", params, [1, 2, 3]), WholeAnswer(sequences, usage)


def sequence(index: int, text: str, tokens: int, finish: FinishReason, **fields) -> SequenceAnswer:
    return SequenceAnswer(index, [text], finish_reason=finish, token_count=tokens, **fields)


def test_result_response_lists_sequences_only_when_several() -> None:
    one = native_response(*whole([sequence(0, "a", 2, FinishReason.LENGTH)]), strings)
    assert one.sequences is None and one.log_probs is None and one.cum_log_prob is None
    several = whole(
        [
            sequence(0, "a", 2, FinishReason.LENGTH, log_probs=[-0.5, -0.25], token_ids=[5, 6]),
            sequence(1, "b", 1, FinishReason.STOP, log_probs=[-1.0], token_ids=[7]),
        ],
        log_probs=True,
    )
    response = native_response(*several, strings)
    assert response.text == "a" and response.finish_reason is FinishReason.LENGTH
    assert response.usage.completion_tokens == 3 and response.usage.total_tokens == 6
    assert response.cum_log_prob == -0.75
    assert [s.text for s in response.sequences or []] == ["a", "b"]
    assert [s.cum_log_prob for s in response.sequences or []] == [-0.75, -1.0]


@pytest.mark.parametrize(
    ("stops", "sent"),
    [
        (["when"], ["when", " when"]),
        ([" when"], [" when"]),  # already spaced
        (["\n\n"], ["\n\n"]),
        (["a", " a", "b"], ["a", " a", "b", " b"]),  # no duplicates, order kept
    ],
)
def test_engine_gets_each_stop_string_with_a_leading_space_too(
    stops: list[str], sent: list[str]
) -> None:
    assert engine_stop_words(stops) == sent


async def test_stop_words_reach_the_engine_on_every_route(tokenizer) -> None:
    params = SamplingParams(stop=["fox"])
    for route in Route:
        generator = Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS, route=route)
        tensors, _ = generator._triton_inputs(generator.prepare("The", params), False)
        if route is Route.DIRECT:
            ids, offsets = tensors["stop_words_list"][0]
            words, start = [], 0
            for end in offsets[offsets >= 0]:
                words.append(tokenizer.decode(ids[start:end].tolist()))
                start = end
            assert words == ["fox", " fox"]
        elif route is Route.ENSEMBLE:
            assert tensors["stop_words"].tolist() == [[b"fox", b" fox"]]
        elif route is Route.LLMAPI:  # the LLM API tokenizes them itself: strings, spaced too
            assert tensors["sampling_param_stop"].tolist() == [b"fox", b" fox"]
        else:  # the BLS also cuts its text at them: exactly the stop strings sent
            assert tensors["stop_words"].tolist() == [[b"fox"]]


def test_result_response_names_the_alternatives() -> None:
    top = [([5, 9], [-0.5, -1.5]), ([6, 2], [-0.25, -9999.0])]
    one = sequence(
        0,
        "ab",
        2,
        FinishReason.LENGTH,
        log_probs=[-0.5, -0.25],
        token_ids=[5, 6],
        top_log_probs=top,
    )
    response = native_response(*whole([one], log_probs=True, top=2), strings)
    assert [[(t.token_id, t.token, t.log_prob) for t in row] for row in response.top_log_probs] == [
        [(5, "<5>", -0.5), (9, "<9>", -1.5)],
        [(6, "<6>", -0.25), (2, "<2>", -9999.0)],
    ]


def test_top_log_probs_need_log_probs() -> None:
    with pytest.raises(ValueError, match="return_log_probs"):
        SamplingParams(top_log_probs=2)
    assert SamplingParams(top_log_probs=2, return_log_probs=True).top_log_probs == 2


async def test_top_log_probs_are_refused_where_no_alternatives_come_back(tokenizer) -> None:
    params = SamplingParams(return_log_probs=True, top_log_probs=2)
    cpp = Generator(
        TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS,
        top_log_probs_unsupported="the C++ backend returns the chosen token's only",
    )  # fmt: skip
    with pytest.raises(RequestError, match="C\\+\\+ backend") as caught:
        cpp.prepare("Once upon", params)
    assert caught.value.param == "top_log_probs"
    for route in (Route.ENSEMBLE, Route.BLS):
        text = Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS, route=route)
        with pytest.raises(RequestError, match="direct route"):
            text.prepare("Once upon", params)
    for route in (Route.DIRECT, Route.LLMAPI):
        generator = Generator(TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS, route=route)
        tensors, outputs = generator._triton_inputs(generator.prepare("Once", params), False)
        assert {"output_log_probs", "output_top_token_ids", "output_top_log_probs"} <= set(outputs)
        if route is Route.DIRECT:
            assert tensors["top_log_probs"].tolist() == [[2]]
            assert tensors["return_log_probs"].tolist() == [[True]]
        else:
            assert tensors["sampling_param_logprobs"].tolist() == [2]


def test_a_text_that_starts_with_bos_gets_no_second_one(generator: Generator, tokenizer) -> None:
    bos = tokenizer.bos_token_id
    plain = generator.prepare("The cat", SamplingParams(max_tokens=1))
    assert plain.prompt_ids[0] == bos and plain.prompt_ids[1] != bos
    led = generator.prepare(f"{BOS}The cat", SamplingParams(max_tokens=1))
    assert led.prompt_ids == plain.prompt_ids
    as_sent = generator.prepare("The cat", SamplingParams(max_tokens=1), add_special_tokens=False)
    assert as_sent.prompt_ids == plain.prompt_ids[1:]


def test_token_id_prompts_are_checked_and_echo_their_text(generator: Generator, tokenizer) -> None:
    ids = list(tokenizer.encode("The cat"))
    if generator.route is Route.BLS:  # the text routes' models tokenize text themselves
        with pytest.raises(RequestError, match="TRTLLM_ROUTE=direct"):
            generator.prepare("", SamplingParams(max_tokens=1), token_ids=ids)
        return
    prepared = generator.prepare("", SamplingParams(max_tokens=1), token_ids=ids)
    assert prepared.prompt_ids == ids
    assert prepared.prompt == tokenizer.decode(ids, skip_special_tokens=True) == "The cat"
    for bad, message in (([], "no token ids"), ([1, len(tokenizer)], "outside the vocabulary")):
        with pytest.raises(RequestError, match=message) as caught:
            generator.prepare("", SamplingParams(max_tokens=1), token_ids=bad)
        assert caught.value.code == "invalid_value"  # not a context length's
