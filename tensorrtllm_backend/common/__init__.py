"""Small modules imported by more than one process (pack time, the BentoML worker, the python
stubs). They import nothing from ``build/``, ``serving/``, ``triton/`` or ``python_models/``."""
