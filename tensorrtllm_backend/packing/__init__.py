"""Pack time: what `pack_model.py` runs on the machine that packs a model.

Engine and checkpoint inspection, the demo model, filling the Triton templates and writing the
result into the BentoML model store. Nothing here runs while the service serves.
"""
