"""The chat core every chat-family API is built on: the chat request (:mod:`.request`), its
preparation (:mod:`.core`: template, tools, reasoning, output constraint, engine checks), and the
one answer-event stream (:mod:`.stream`) each API renders. It imports no API package."""
