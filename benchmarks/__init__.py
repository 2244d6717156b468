"""The streaming benchmark (stream_bench.py, ttft_open_loop.py) and its parts.

Importing the package sets the environment every benchmark process needs before BentoML or
transformers are imported: nothing is downloaded, nothing is reported.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
