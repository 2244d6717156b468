"""Anthropic's Messages API (`/v1/messages`): protocol models, the adapter over the chat path,
and its routes."""
