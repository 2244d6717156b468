"""config.json of a TensorRT-LLM engine as trtllm-build >= 0.9 writes it, trimmed to what a reader
may look at: for the tests that inspect engine directories and those that pack them."""

from __future__ import annotations

from typing import Any


def modern_config(world_size: int = 2, **build_overrides: Any) -> dict[str, Any]:
    """A Llama engine built with tp 2 (`world_size` ranks); `build_overrides` replace
    build_config entries."""
    build = {
        "max_batch_size": 64,
        "max_input_len": 2048,
        "max_seq_len": 4096,
        "max_beam_width": 1,
        "max_num_tokens": 8192,
        "plugin_config": {"gpt_attention_plugin": "float16", "lora_plugin": None},
    }
    build.update(build_overrides)
    return {
        "version": "0.12.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "vocab_size": 128256,
            "mapping": {"world_size": world_size, "tp_size": 2, "pp_size": 1},
        },
        "build_config": build,
    }
