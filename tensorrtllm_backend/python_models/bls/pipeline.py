"""What the tensorrt_llm_bls model does besides talking to Triton: tensor routing and text streams.

Kept free of pb_utils so it is unit-testable; model.py only moves tensors and responses.
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PreTrainedTokenizerBase

from tensorrtllm_backend.common.tokenization import IncrementalDetokenizer, StopStringMatcher

# BLS client input -> preprocessing input (the ensemble's first step, same names as NVIDIA's).
PREPROCESSING_INPUTS: dict[str, str] = {
    "text_input": "QUERY",
    "decoder_text_input": "DECODER_QUERY",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
    "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID",
}

# preprocessing output -> tensorrt_llm input.
PREPROCESSED_TO_ENGINE: dict[str, str] = {
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": "input_lengths",
    "DECODER_INPUT_ID": "decoder_input_ids",
    "REQUEST_DECODER_INPUT_LEN": "decoder_input_lengths",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
    "EMBEDDING_BIAS": "embedding_bias",
    "STOP_WORDS_IDS": "stop_words_list",
    "BAD_WORDS_IDS": "bad_words_list",
    "OUT_PROMPT_TABLE_EXTRA_IDS": "prompt_table_extra_ids",
}

# BLS client input -> tensorrt_llm input, as the ensemble wires them. v0.19/v0.8 names
# (min_length, random_seed) map to the newer ones so either template works.
CLIENT_TO_ENGINE: dict[str, str] = {
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "length_penalty": "len_penalty",
    "stream": "streaming",
    "min_length": "min_tokens",
    "random_seed": "seed",
    **{
        name: name
        for name in (
            "exclude_input_in_output",
            "temperature",
            "repetition_penalty",
            "min_tokens",
            "presence_penalty",
            "frequency_penalty",
            "seed",
            "return_log_probs",
            "return_context_logits",
            "return_generation_logits",
            "return_perf_metrics",
            "num_return_sequences",
            "beam_width",
            "prompt_embedding_table",
            "prompt_vocab_size",
            "lora_task_id",
            "lora_weights",
            "lora_config",
            "guided_decoding_guide_type",
            "guided_decoding_guide",
        )
    },
}

# tensorrt_llm inputs declared dims [1] (one value per request): forwarded as [batch, 1] whatever
# shape a reshape in the BLS config gave them.
SCALAR_ENGINE_INPUTS: frozenset[str] = frozenset(
    set(CLIENT_TO_ENGINE.values()) - {"prompt_embedding_table", "lora_weights", "lora_config"}
)

# Inputs that need a model this BLS does not drive (multimodal encoder, draft model).
UNSUPPORTED_INPUTS: tuple[str, ...] = (
    "image_input",
    "image_bytes_input",
    "image_url_input",
    "video_bytes_input",
)

TOKEN_OUTPUTS = ("output_ids", "sequence_length")
TEXT_OUTPUT = "text_output"


class TextStream:
    """One generated sequence (one beam) from token deltas to client text.

    Incremental detokenization, then text-level stop strings (the engine only matches token ids,
    which miss stop strings that tokenize differently in context). `text` is everything emitted
    so far (what accumulate_tokens sends).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        stop_strings: Iterable[str] = (),
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self._matcher = StopStringMatcher(stop_strings)
        self.text = ""  # everything emitted so far

    @property
    def stopped(self) -> bool:
        return self._matcher.stopped

    def feed(self, token_ids: Iterable[int]) -> str:
        """New tokens in; the text delta that is final (cut at a stop string)."""
        delta, _ = self._matcher.feed(self._detokenizer.feed(token_ids))
        return self._emit(delta)

    def finish(self) -> str:
        """End of the sequence: release text held back for a possible stop string.

        A trailing partial character is not released (see IncrementalDetokenizer), so the BLS
        returns the same text as the ensemble.
        """
        return self._emit(self._matcher.flush())

    def _emit(self, delta: str) -> str:
        self.text += delta
        return delta
