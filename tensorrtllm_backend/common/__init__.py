"""Small modules that more than one layer imports: more than one process (pack time, the BentoML
worker, the python stubs), or both halves of the worker (``serving/`` and ``triton/``: the engine
interface). They import nothing from ``packing/``, ``serving/``, ``triton/`` or
``python_models/``."""
