"""OpenAI-compatible API (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) over the same
generation core as the native API."""
