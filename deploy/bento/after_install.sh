#!/bin/sh
# bentofile.yaml's docker.setup_script: runs while the Bento's image is built, after BentoML
# installed requirements-bento.txt into the base image's own Python (UV_SYSTEM_PYTHON), with the
# base image's TensorRT-LLM stack pinned (UV_CONSTRAINT; both lists written by service.py's
# bento_image() before the install).
#
# 1. BentoML's /app/.venv (first on PATH, activated by its entrypoint) is made to see the image's
#    packages, so that `python` there is the image's Python with everything installed.
# 2. Checks, failing the build: one Python (the venv's base is the image's python3, no Python of
#    uv's own was downloaded); the image's TensorRT-LLM stack is at the versions it had (our
#    requirements reinstalled, upgraded or shadowed none of it); the service's requirements
#    import. Other packages of the image that the requirements moved are listed.
set -eu
venv=/app/.venv
constraints="${UV_CONSTRAINT:-/app/image-constraints.txt}"
packages=/app/image-packages.txt
sed -i 's/^include-system-site-packages = false$/include-system-site-packages = true/' "$venv/pyvenv.cfg"
if [ -e /app/python ]; then
  echo "after_install: uv downloaded a Python of its own into /app/python" >&2
  exit 1
fi
"$venv/bin/python" - "$constraints" "$packages" <<'PY'
import importlib.metadata
import os
import subprocess
import sys

image_python = subprocess.run(
    ["python3", "-c", "import sys; print(sys.base_prefix, sys.version_info[:2])"],
    env={**os.environ, "PATH": os.environ["PATH"].replace("/app/.venv/bin", "")},
    capture_output=True, text=True, check=True,
).stdout.strip()
mine = f"{sys.base_prefix} {tuple(sys.version_info[:2])}"
if mine != image_python:
    sys.exit(f"after_install: /app/.venv runs {mine}, the image's python3 is {image_python}")


def changed(listing):
    moved = []
    with open(listing, encoding="utf-8") as pins:
        for line in pins:
            name, _, frozen = line.strip().partition("==")
            try:
                now = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                now = "missing"
            if now != frozen:
                moved.append(f"{name} {frozen} -> {now}")
    return moved


stack = changed(sys.argv[1])
if stack:
    sys.exit("after_install: the base image's TensorRT-LLM stack changed: " + ", ".join(stack))
others = changed(sys.argv[2])
if others:
    print("after_install: for the service's requirements, these packages of the base image moved:",
          ", ".join(others))

for module in ("bentoml", "tritonclient.grpc.aio", "transformers", "pydantic_settings", "yaml"):
    __import__(module)
for name in ("tensorrt_llm", "torch", "xgrammar"):
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = "not in this image"
    print(f"after_install: the image's {name}: {version}")
print(f"after_install: one Python, {mine}; the image's TensorRT-LLM stack unchanged")
PY
