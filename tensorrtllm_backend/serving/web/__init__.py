"""The HTTP plumbing every API package shares (request bodies, errors, SSE framing, streamed
responses). No API lives here, and nothing here knows one."""
