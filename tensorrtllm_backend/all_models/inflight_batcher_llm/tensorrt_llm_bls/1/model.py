"""tensorrt_llm_bls: the ensemble's job in one Python model with BLS calls.

preprocessing (BLS) -> tensorrt_llm (BLS, streamed when the client asks) -> incremental
detokenization here (no postprocessing hop per token) -> text-level stop strings.
Each request runs on its own worker thread so one slow stream never blocks the others.
Cancellation: the python backend of Triton 2.51 cannot cancel a BLS response iterator, so the
inner request is ended like NVIDIA's BLS does it: a `stop=true` request with its request id.
"""

import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

# Triton's python stub ignores PYTHONPATH: the supervisor passes our paths (venv, package) here.
sys.path[:0] = filter(None, os.environ.get("TRTLLM_BACKEND_PYTHONPATH", "").split(os.pathsep))

import numpy as np
import triton_python_backend_utils as pb_utils

from tensorrtllm_backend.python_models.bls.params import (
    model_parameter,
    model_tokenizer,
    parse_bool,
    sibling_parameter,
)
from tensorrtllm_backend.python_models.bls.pipeline import (
    CLIENT_TO_ENGINE,
    PREPROCESSED_TO_ENGINE,
    PREPROCESSING_INPUTS,
    SCALAR_ENGINE_INPUTS,
    TEXT_OUTPUT,
    TOKEN_OUTPUTS,
    UNSUPPORTED_INPUTS,
    TextStream,
)
from tensorrtllm_backend.python_models.request_error import RequestError
from tensorrtllm_backend.python_models.stub_guard import start_orphan_guard

PREPROCESSING_MODEL = "preprocessing"
CANCEL_POLL_INTERVAL_S = 0.05  # is_cancelled() is an IPC round trip: not on every token
MAX_WORKERS = 256  # concurrent streams per instance; more wait for a free worker


def _input(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _flag(request, name: str) -> bool:
    value = _input(request, name)
    return bool(value is not None and value.size and value.reshape(-1)[0])


def _strings(value: np.ndarray | None) -> list[str]:
    if value is None:
        return []
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]


def _outputs(response) -> dict[str, np.ndarray]:
    return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}


def _error_message(error) -> str:
    return error.message() if hasattr(error, "message") else str(error)


class TritonPythonModel:
    """Text in, text out, streamed, with stop strings and cancellation."""

    def initialize(self, args: dict[str, str]) -> None:
        self._orphan_guard = start_orphan_guard()  # exits with the stub
        self.model_config = json.loads(args["model_config"])
        repository = args["model_repository"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.accumulate = parse_bool(
            model_parameter(self.model_config, "accumulate_tokens"), False, "accumulate_tokens"
        )
        self.engine_model = (
            model_parameter(self.model_config, "tensorrt_llm_model_name") or "tensorrt_llm"
        )
        if model_parameter(self.model_config, "tensorrt_llm_draft_model_name"):
            raise ValueError("tensorrt_llm_bls: speculative decoding (draft model) is unsupported")
        self.tokenizer = model_tokenizer(
            self.model_config, repository, "tensorrt_llm_bls", fallback_model=PREPROCESSING_MODEL
        )
        skip = model_parameter(self.model_config, "skip_special_tokens") or sibling_parameter(
            repository, "postprocessing", "skip_special_tokens"
        )
        self.skip_special_tokens = parse_bool(skip, True, "skip_special_tokens")
        self.declared_outputs = {o["name"] for o in self.model_config.get("output", [])}
        self.pool = ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="bls")
        self.logger = pb_utils.Logger

    def execute(self, requests: list) -> list | None:
        if self.decoupled:
            for request in requests:
                self.pool.submit(self._serve_decoupled, request)
            return None
        futures = [self.pool.submit(self._serve_single, request) for request in requests]
        return [future.result() for future in futures]

    def finalize(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ----- one request -------------------------------------------------------------------

    def _serve_decoupled(self, request) -> None:
        sender = request.get_response_sender()
        try:
            _Stream(self, request, sender).run()
        except RequestError as exc:
            self._send_error(sender, str(exc))
        except Exception as exc:  # the stream must end with a final flag whatever happens
            self.logger.log_error(f"tensorrt_llm_bls: {type(exc).__name__}: {exc}")
            self._send_error(sender, f"tensorrt_llm_bls failed: {type(exc).__name__}: {exc}")

    @staticmethod
    def _send_error(sender, message: str) -> None:
        try:
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        except Exception:  # already finished or the client is gone
            pass

    def _serve_single(self, request):
        try:
            return _Stream(self, request, None).run_single()
        except RequestError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        except Exception as exc:
            message = f"tensorrt_llm_bls failed: {type(exc).__name__}: {exc}"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class _Stream:
    """State of one client request: its inner requests, text streams and what is sent."""

    def __init__(self, model: TritonPythonModel, request, sender) -> None:
        self.model = model
        self.request = request
        self.sender = sender
        self.inner_id = f"bls-{uuid.uuid4().hex}"
        self.streaming = _flag(request, "stream")
        if self.streaming and not model.decoupled:
            raise RequestError("streaming requires the decoupled transaction policy")
        self.stop_strings = _strings(_input(request, "stop_words"))
        requested = set(request.requested_output_names()) or model.declared_outputs
        self.passthrough = (requested & model.declared_outputs) - {TEXT_OUTPUT}
        num_sequences = _input(request, "num_return_sequences")
        self.expected_sequences = (
            max(1, int(num_sequences.reshape(-1)[0])) if num_sequences is not None else 1
        )
        self.streams: dict[tuple[int, int], TextStream] = {}
        self.stopped_sequences: set[int] = set()
        self.last_cancel_check = 0.0

    # ----- inner requests ------------------------------------------------------------------

    def _validate(self) -> None:
        text = _input(self.request, "text_input")
        if text is None:
            raise RequestError("text_input is required")
        if text.shape[0] != 1:
            raise RequestError("tensorrt_llm_bls takes one prompt per request (batch size 1)")
        for name in UNSUPPORTED_INPUTS:
            if _input(self.request, name) is not None:
                raise RequestError(f"{name}: multimodal input is not supported")
        drafts = _input(self.request, "num_draft_tokens")
        if drafts is not None and drafts.size and int(drafts.reshape(-1)[0]) > 0:
            raise RequestError("num_draft_tokens: speculative decoding is not supported")

    def _preprocess(self) -> dict[str, np.ndarray]:
        inputs = []
        for client_name, name in PREPROCESSING_INPUTS.items():
            value = _input(self.request, client_name)
            if value is not None:
                inputs.append(pb_utils.Tensor(name, value))
        response = pb_utils.InferenceRequest(
            model_name=PREPROCESSING_MODEL,
            inputs=inputs,
            requested_output_names=list(PREPROCESSED_TO_ENGINE),
            request_id=self.inner_id,
        ).exec()
        if response.has_error():
            raise RequestError(_error_message(response.error()))
        return _outputs(response)

    def _engine_request(self, preprocessed: dict[str, np.ndarray]):
        inputs = [
            pb_utils.Tensor(PREPROCESSED_TO_ENGINE[name], value)
            for name, value in preprocessed.items()
            if name in PREPROCESSED_TO_ENGINE
        ]
        for client_name, name in CLIENT_TO_ENGINE.items():
            value = _input(self.request, client_name)
            if value is None:
                continue
            if name in SCALAR_ENGINE_INPUTS:
                value = value.reshape(-1, 1)  # the BLS config may reshape to [batch]
            inputs.append(pb_utils.Tensor(name, value))
        if _input(self.request, "stream") is None:
            inputs.append(pb_utils.Tensor("streaming", np.array([[False]])))
        return pb_utils.InferenceRequest(
            model_name=self.model.engine_model,
            inputs=inputs,
            requested_output_names=sorted(self._engine_outputs()),
            request_id=self.inner_id,
        )

    def _engine_outputs(self) -> set[str]:
        # Triton drops outputs nobody asked for: several sequences are told apart by
        # sequence_index even when the client did not request it.
        outputs = set(TOKEN_OUTPUTS) | self.passthrough
        if self.expected_sequences > 1:
            outputs.add("sequence_index")
        return outputs

    def _stop_engine(self) -> None:
        """End the inner request early (stop string hit or client gone)."""
        stop = pb_utils.InferenceRequest(
            model_name=self.model.engine_model,
            inputs=[
                pb_utils.Tensor("input_ids", np.zeros((1, 1), np.int32)),
                pb_utils.Tensor("input_lengths", np.ones((1, 1), np.int32)),
                pb_utils.Tensor("request_output_len", np.ones((1, 1), np.int32)),
                pb_utils.Tensor("stop", np.array([[True]])),
            ],
            requested_output_names=["output_ids"],
            request_id=self.inner_id,
        )
        try:
            if self.model.decoupled:
                for _ in stop.exec(decoupled=True):
                    pass
            else:
                stop.exec()
        except Exception as exc:  # best effort: the request may have ended on its own
            self.model.logger.log_warn(f"tensorrt_llm_bls: stop request failed: {exc}")

    # ----- responses -----------------------------------------------------------------------

    def _cancelled(self) -> bool:
        now = time.monotonic()
        if now - self.last_cancel_check < CANCEL_POLL_INTERVAL_S:
            return False
        self.last_cancel_check = now
        return bool(self.request.is_cancelled())

    def _new_stream(self) -> TextStream:
        return TextStream(
            self.model.tokenizer,
            self.stop_strings,
            skip_special_tokens=self.model.skip_special_tokens,
        )

    def _decode(self, outputs: dict[str, np.ndarray]):
        """One engine response -> (sequence index, delta per beam, chunk per beam, stopped).

        The chunk is what the client gets: the delta, or the whole text with accumulate_tokens.
        None for an empty (final-flag only) response.
        """
        if "output_ids" not in outputs:
            return None
        tokens = outputs["output_ids"]
        if tokens.ndim > 1:
            # Rows spelled out: -1 cannot be inferred for the empty [1, 1, 0] of a response that
            # only ends the stream (the end token is not returned).
            tokens = tokens.reshape(int(np.prod(tokens.shape[:-1])), tokens.shape[-1])
        else:
            tokens = tokens[None, :]
        lengths = outputs.get("sequence_length")
        if lengths is None:
            lengths = np.full(tokens.shape[0], tokens.shape[1])
        lengths = lengths.reshape(-1)
        index = outputs.get("sequence_index")
        sequence = int(index.reshape(-1)[0]) if index is not None and index.size else 0
        deltas, chunks = [], []
        stopped = True
        for beam in range(tokens.shape[0]):
            ids = tokens[beam, : max(0, int(lengths[beam]))].tolist()
            if self.streaming:
                stream = self.streams.setdefault((sequence, beam), self._new_stream())
                delta = stream.feed(ids)
            else:  # each response holds the whole sequence
                stream = self._new_stream()
                delta = stream.feed(ids) + stream.finish()
            deltas.append(delta)
            chunks.append(stream.text if self.model.accumulate and self.streaming else delta)
            stopped = stopped and stream.stopped
        return sequence, deltas, chunks, stopped

    def _response(self, texts: list[str], outputs: dict[str, np.ndarray]):
        text = np.array([[t.encode("utf-8") for t in texts]], dtype=object)
        tensors = [pb_utils.Tensor(TEXT_OUTPUT, text)]
        tensors += [
            pb_utils.Tensor(name, value)
            for name, value in outputs.items()
            if name in self.passthrough
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def run(self) -> None:
        """Decoupled mode: stream (or send whole sequences), then the final flag."""
        self._validate()
        engine = self._engine_request(self._preprocess())
        responses = engine.exec(decoupled=True)
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        ended_early = False
        for response in responses:
            if self._cancelled():
                ended_early = True
                self.model._send_error(self.sender, "request cancelled")
                break
            if response.has_error():
                self.model._send_error(self.sender, _error_message(response.error()))
                return
            outputs = _outputs(response)
            decoded = self._decode(outputs)
            if decoded is None:
                continue
            sequence, deltas, chunks, stopped = decoded
            if sequence in self.stopped_sequences:
                continue  # already cut at a stop string: suppress what the engine still sends
            if stopped:
                self.stopped_sequences.add(sequence)
            if any(deltas) or self.passthrough & outputs.keys():
                self.sender.send(self._response(chunks, outputs))
            if len(self.stopped_sequences) >= self.expected_sequences:
                ended_early = True
                self.sender.send(flags=final)
                break
        if ended_early:
            self._stop_engine()
            for _ in responses:  # let the inner request finish; its output is not wanted
                pass
            return
        self._finish_streams(final)

    def _finish_streams(self, final: int) -> None:
        """End of the engine's stream: release text held back for possible stop strings."""
        by_sequence: dict[int, list[tuple[str, str]]] = {}
        for (sequence, _beam), stream in sorted(self.streams.items()):
            if sequence not in self.stopped_sequences:
                delta = stream.finish()
                chunk = stream.text if self.model.accumulate else delta
                by_sequence.setdefault(sequence, []).append((delta, chunk))
        pending = [
            (sequence, [chunk for _, chunk in beams])
            for sequence, beams in by_sequence.items()
            if any(delta for delta, _ in beams)
        ]
        for position, (sequence, chunks) in enumerate(pending):
            extra = {}
            if "sequence_index" in self.passthrough:
                extra["sequence_index"] = np.array([[sequence]], np.int32)
            last = position == len(pending) - 1
            self.sender.send(self._response(chunks, extra), flags=final if last else 0)
        if not pending:
            self.sender.send(flags=final)

    def run_single(self):
        """Non-decoupled mode: one response with the whole text."""
        self._validate()
        response = self._engine_request(self._preprocess()).exec()
        if response.has_error():
            raise RequestError(_error_message(response.error()))
        outputs = _outputs(response)
        decoded = self._decode(outputs)
        if decoded is None:
            raise RequestError(f"{self.model.engine_model} returned no output_ids")
        return self._response(decoded[2], outputs)
