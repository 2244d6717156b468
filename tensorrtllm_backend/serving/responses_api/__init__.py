"""OpenAI's Responses API: its protocol, its renderer over the chat core, its stored responses."""
