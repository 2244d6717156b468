"""Helpers of the Python models (preprocessing, postprocessing, tensorrt_llm_bls).

Kept out of the model.py files so they can be imported and unit-tested without a Triton stub.
Only numpy/transformers here: the Triton stub imports these modules.
"""
