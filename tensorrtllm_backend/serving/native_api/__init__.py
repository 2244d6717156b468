"""The native API's renderer (`/generate`, `/generate_text`; the routes are `service.py`'s
`@bentoml.api` methods, the protocol :mod:`..schemas`)."""
