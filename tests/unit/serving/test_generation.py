"""Generator.prepare (engine limits) and the Triton tensors a prepared request becomes.

prepare() never talks to Triton, so the client points at a closed port; the tokenizer is the demo
model's, trained locally.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast
from triton_results import result

from tensorrtllm_backend.common.engine_api import EngineRequestError
from tensorrtllm_backend.common.lora import LoraAdapter
from tensorrtllm_backend.packing.demo import BOS, EOS, PAD, train_tokenizer
from tensorrtllm_backend.serving.chat.core import ChatCore
from tensorrtllm_backend.serving.chat.stream import SequenceAnswer, WholeAnswer
from tensorrtllm_backend.serving.chat.usage import TokenCount
from tensorrtllm_backend.serving.generation import EngineLimits, Generator, PreparedRequest
from tensorrtllm_backend.serving.native_api.render import native_response
from tensorrtllm_backend.serving.openai_api.completions import CompletionServing
from tensorrtllm_backend.serving.openai_api.protocol import CompletionRequest
from tensorrtllm_backend.serving.request_errors import RequestError
from tensorrtllm_backend.serving.runtime import LLMRuntime
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


# -- prompt scores where the generation returns no alternatives ------------------------------

CPP_REASON = "the C++ backend returns the chosen token's log prob only"
GREEDY = 40  # the first generated token of ScoringEngine's answers
NEXT_TOP = ([GREEDY, 41], [-0.25, -1.75])  # the scorer's k = 2 most likely after the prompt


class ScoringEngine:
    """An InferenceEngine standing in for a C++ engine and the prompt_logprobs model beside it:
    the scorer answers k = 2 alternatives per prompt position, and the next token's when asked;
    the engine generates GREEDY with its log prob, no alternatives."""

    open_streams = 0
    responses_received = 0

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, np.ndarray], list[str]]] = []

    async def stream(self, model_name, tensors, outputs, request_id):
        self.requests.append((model_name, dict(tensors), list(outputs)))
        if model_name == "prompt_logprobs":
            rows = len(tensors["input_ids"]) - 1
            k = int(tensors["top_log_probs"][0])
            answer = {
                "prompt_log_probs": np.full(rows, -1.0, np.float32),
                "prompt_top_token_ids": np.tile(np.arange(k, dtype=np.int32), (rows, 1)),
                "prompt_top_log_probs": np.tile(-np.arange(1, k + 1, dtype=np.float32), (rows, 1)),
                "prompt_token_ranks": np.ones(rows, np.int32),
            }
            if "next_top_token_ids" in outputs:
                answer["next_top_token_ids"] = np.asarray(NEXT_TOP[0][:k], np.int32)
                answer["next_top_log_probs"] = np.asarray(NEXT_TOP[1][:k], np.float32)
            yield result(**answer)
            return
        yield result(
            output_ids=np.asarray([[[GREEDY]]], np.int32),
            sequence_length=np.asarray([[1]], np.int32),
            output_log_probs=np.asarray([[[NEXT_TOP[1][0]]]], np.float32),
        )

    def let_finish(self, responses, *args) -> None:
        pass

    async def close(self) -> None:
        pass


def cpp_generator(tokenizer, engine=None, **options) -> Generator:
    """A generator as the runtime makes one for a TensorRT-LLM engine (direct route)."""
    engine = engine or TritonLLMClient("127.0.0.1:1")
    return Generator(engine, tokenizer, LIMITS, top_log_probs_unsupported=CPP_REASON, **options)


@pytest.mark.parametrize("route", [Route.DIRECT, Route.ENSEMBLE, Route.BLS])
async def test_prompt_alternatives_do_not_depend_on_the_generations(tokenizer, route) -> None:
    """The scorer returns the prompt's alternatives whatever the generation returns: a C++
    engine and the text routes (no alternatives from the generation) score with k > 0."""
    generator = cpp_generator(tokenizer) if route is Route.DIRECT else Generator(
        TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS, route=route
    )  # fmt: skip
    assert generator.top_log_probs_missing is not None
    prepared = generator.prepare("The cat sat", SamplingParams(max_tokens=1))
    for k in (0, 1, 5):
        generator.check_scoring(prepared, k)
    generator.check_scoring(prepared, 1, first_token=True)  # greedy: the model's distribution


def scorer_missing(gather: bool, repository_has_it: bool) -> str | None:
    """What the runtime says of an engine's prompt scores (None: it serves them)."""
    runtime = SimpleNamespace(
        engine=SimpleNamespace(gather_context_logits=gather), has_prompt_scorer=repository_has_it
    )
    return LLMRuntime._prompt_scores_unsupported(runtime)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("refuse", "message"),
    [
        ("no context logits", "--gather_context_logits"),
        ("no scorer model", "repository lacks .packed by an older version.: repack"),
        ("lora on an engine", "LoRA adapter are served by the LLM API workflow"),
        ("images on the llm api", "not served for prompts with images"),
    ],
)
async def test_a_route_that_cannot_score_says_why(tokenizer, refuse: str, message: str) -> None:
    route = Route.LLMAPI if "llm api" in refuse else Route.DIRECT
    reason = {
        "no context logits": scorer_missing(gather=False, repository_has_it=True),
        "no scorer model": scorer_missing(gather=True, repository_has_it=False),
    }.get(refuse)
    assert scorer_missing(gather=True, repository_has_it=True) is None
    generator = Generator(
        TritonLLMClient("127.0.0.1:1"), tokenizer, LIMITS, route=route,
        prompt_scores_unsupported=reason,
    )  # fmt: skip
    prepared = generator.prepare("The cat sat", SamplingParams(max_tokens=1))
    if "lora" in refuse:
        prepared.lora = LoraAdapter("style", Path("/adapters/style"), 1)
    if "images" in refuse:
        prepared.images = (SimpleNamespace(data=b"png"),)  # type: ignore[assignment]
    for k in (0, 2):
        with pytest.raises(RequestError, match=message) as caught:
            generator.check_scoring(prepared, k)
        assert caught.value.status == 400 and caught.value.param == "echo"


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"temperature": 0.7}, "temperature"),
        ({"repetition_penalty": 1.3}, "repetition_penalty"),
        ({"min_tokens": 1}, "min_tokens"),
        ({"presence_penalty": 0.5, "frequency_penalty": 0.5}, "presence_penalty, frequency"),
    ],
)
async def test_first_token_alternatives_from_scores_need_the_models_distribution(
    tokenizer, params: dict, named: str
) -> None:
    """The scores' last row is the model's own distribution: a request whose sampling would
    change the first token's is refused rather than answered with other numbers."""
    generator = cpp_generator(tokenizer)
    for plain in ({}, {"temperature": 0.0}, {"temperature": 1.0}):
        generator.check_scoring(generator.prepare("The cat", SamplingParams(**plain)), 2, True)
    prepared = generator.prepare("The cat", SamplingParams(**params))
    generator.check_scoring(prepared, 2)  # the prompt's scores alone: any sampling
    with pytest.raises(RequestError, match=named) as caught:
        generator.check_scoring(prepared, 2, first_token=True)
    assert CPP_REASON in str(caught.value) and caught.value.param == "top_log_probs"


async def test_the_scorer_answers_the_next_tokens_alternatives_when_asked(tokenizer) -> None:
    engine = ScoringEngine()
    generator = cpp_generator(tokenizer, engine)
    prepared = generator.prepare("The cat sat", SamplingParams(max_tokens=1))
    scores = await generator.score(prepared, 2)
    assert len(scores.log_probs) == len(prepared.prompt_ids) - 1
    assert "next_top_token_ids" not in engine.requests[-1][2]  # not asked: not computed
    scores, following = await generator.score_with_next(prepared, 2)
    assert following == NEXT_TOP and scores.top is not None
    model, tensors, outputs = engine.requests[-1]
    assert model == "prompt_logprobs" and tensors["top_log_probs"].tolist() == [2]
    assert {"next_top_token_ids", "next_top_log_probs"} <= set(outputs)


class OlderScorer(ScoringEngine):
    """A prompt_logprobs model packed before it had the next token's outputs: Triton refuses
    a request for them."""

    async def stream(self, model_name, tensors, outputs, request_id):
        if "next_top_token_ids" in outputs:
            raise EngineRequestError(
                "prompt_logprobs refused the request: unexpected inference output "
                "'next_top_token_ids' for model 'prompt_logprobs'"
            )
        async for answer in super().stream(model_name, tensors, outputs, request_id):
            yield answer


async def test_a_scorer_packed_before_the_next_tokens_outputs_asks_for_a_repack(tokenizer):
    generator = cpp_generator(tokenizer, OlderScorer())
    prepared = generator.prepare("The cat sat", SamplingParams(max_tokens=1))
    await generator.score(prepared, 2)  # the prompt's own scores: served as before
    with pytest.raises(RequestError, match="repack the model") as caught:
        await generator.score_with_next(prepared, 2)
    assert caught.value.status == 400


async def completions(engine: ScoringEngine, tokenizer, **fields) -> dict:
    serving = CompletionServing(ChatCore(cpp_generator(tokenizer, engine), "demo"))
    request = CompletionRequest.model_validate({"model": "demo", "prompt": "The cat", **fields})
    plan = await serving.prepare(request)
    return json.loads(await serving.complete(plan, request))


async def test_lm_eval_loglikelihood_on_a_cpp_engine_gets_the_first_tokens_alternatives(
    tokenizer,
) -> None:
    """`echo, logprobs: k, max_tokens: 1` (lm-evaluation-harness's loglikelihood) where the
    generation returns the chosen token's log prob only: the prompt's alternatives and the
    generated token's come from the one scoring request (its last row)."""
    engine = ScoringEngine()
    body = await completions(engine, tokenizer, echo=True, logprobs=1, max_tokens=1, temperature=0)
    logprobs = body["choices"][0]["logprobs"]
    prompt_tokens = body["usage"]["prompt_tokens"]
    assert len(logprobs["tokens"]) == prompt_tokens + 1
    generated = logprobs["top_logprobs"][-1]
    assert generated == {tokenizer.convert_ids_to_tokens(GREEDY): NEXT_TOP[1][0]}  # k = 1
    assert logprobs["token_logprobs"][-1] == NEXT_TOP[1][0]  # the engine's own
    (score_model, score_tensors, _), (model, tensors, _) = engine.requests
    assert score_model == "prompt_logprobs" and score_tensors["top_log_probs"].tolist() == [1]
    assert model == "tensorrt_llm" and "top_log_probs" not in tensors  # none asked of it
    # max_tokens 0 scores without generating: nothing asks the engine for alternatives
    engine = ScoringEngine()
    body = await completions(engine, tokenizer, echo=True, logprobs=2, max_tokens=0)
    assert [model for model, _, _ in engine.requests] == ["prompt_logprobs"]
    assert len(body["choices"][0]["logprobs"]["tokens"]) == prompt_tokens


@pytest.mark.parametrize(
    "fields",
    [
        {"echo": True, "logprobs": 1, "max_tokens": 2},
        {"echo": False, "logprobs": 1, "max_tokens": 1},
        {"echo": True, "logprobs": 1},  # max_tokens: OpenAI's 16
    ],
)
async def test_generated_alternatives_beyond_the_first_token_are_a_400_saying_what_works(
    tokenizer, fields: dict
) -> None:
    with pytest.raises(RequestError, match="with echo and max_tokens 1") as caught:
        await completions(ScoringEngine(), tokenizer, **fields)
    assert CPP_REASON in str(caught.value) and caught.value.param == "logprobs"
