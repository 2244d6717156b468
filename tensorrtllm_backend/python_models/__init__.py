"""Code that runs inside Triton's python stubs (a separate process per model instance, with the
stub's own interpreter): helpers of the preprocessing, postprocessing and BLS models
(:mod:`.bls`), the guard that ends an orphaned stub, and the CPU stand-in engine.

Only numpy, torch and transformers here (and xgrammar for guided decoding): no BentoML.
"""
