"""Test-wide environment: a private BentoML home, no telemetry, nothing downloaded."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Set before bentoml or transformers are imported by any test module.
_HOME = Path(tempfile.mkdtemp(prefix="trtllm-tests-bentoml-"))
os.environ["BENTOML_HOME"] = str(_HOME)
os.environ["BENTOML_DO_NOT_TRACK"] = "true"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.pop("TRTLLM_MODEL", None)


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    import shutil

    shutil.rmtree(_HOME, ignore_errors=True)
