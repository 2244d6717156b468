#!/usr/bin/env bash
# Make a base image that looks like NVIDIA's Triton TensorRT-LLM image
# (nvcr.io/nvidia/tritonserver:*-trtllm-python-py3) where the Bento's image depends on it, for
# tests/integration/test_container.py; print its name. Needs root (debootstrap, chroot) and what
# scripts/install-containers.sh installs.
#
# Like NVIDIA's image:
# - one system Python (Debian bookworm's 3.11, /usr/bin/python3) with its packages in its own
#   site-packages (/usr/local/lib/python3.11/dist-packages), where pip and uv see and install
#   them; pip present, no PEP 668 marker; numpy < 2, as TensorRT-LLM pins it (Triton's python
#   backend stub of 2.51 misreads numpy 2's arrays: BYTES tensors arrive garbled).
#   Its version is not NGC's 3.12: a CPU build of torch exists here only for 3.11 (PyTorch's
#   CPU wheel) and for Debian trixie's 3.13, whose numpy is 2; Ubuntu's 3.12 has no torch. The
#   test builds the Bento with a Python of another version instead, so that nothing of the
#   build machine's version can pass for the image's.
# - tritonserver at /opt/tritonserver/bin (on PATH), its python backend in
#   /opt/tritonserver/backends/python with the stub built for the image's Python, linked to its
#   libpython (the nvidia-pytriton 0.7.0 wheel's tritonserver 2.51);
# - a `tensorrt_llm` package installed system-wide (a stand-in: importable, with a version), torch
#   (2.13, CPU build) and xgrammar (0.2.8) system-wide, transformers with them.
# Also: this machine's CA bundle and the TLS settings that reach the registries through its proxy.
#
# Cached in .container-cache/ (ignored by git): the image in podman's store, its root file
# system as a tarball, debootstrap's packages and the torch wheel (pip's own cache stays empty
# here: what the registries' proxy answers is not cacheable). A change to this script makes a new
# image (its name carries the script's hash), and the old one is removed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.container-cache"
export CONTAINERS_CONF="$cache/containers.conf"
suite=bookworm
python=3.11
key="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
name="localhost/bentotrtllm-ngc-like:$key"
tarball="$cache/ngc-like-$key.tar"
say() { echo "container-base-image: $*" >&2; }

if podman image exists "$name"; then
  echo "$name"
  exit 0
fi

rootfs="$cache/rootfs.tmp"
build_root_file_system() {
  rm -rf "$rootfs"
  mkdir -p "$cache/debs"
  say "torch 2.13 (CPU build) for Python $python"
  mkdir -p "$cache/wheels"
  local torch_wheel
  torch_wheel="$(ls "$cache"/wheels/torch-2.13.0+cpu-cp${python/./}-*.whl 2>/dev/null || true)"
  if [ -z "$torch_wheel" ]; then
    # pip's own settings first (a machine with the CPU wheel on disk), else PyTorch's CPU index.
    local want=(--no-deps --only-binary=:all: --python-version "$python"
      --platform manylinux_2_28_x86_64 -d "$cache/wheels" torch==2.13.0)
    python3 -m pip download --quiet "${want[@]}" >&2 || true
    torch_wheel="$(ls "$cache"/wheels/torch-2.13.0+cpu-cp${python/./}-*.whl 2>/dev/null || true)"
    if [ -z "$torch_wheel" ]; then
      rm -f "$cache"/wheels/torch-*.whl
      python3 -m pip download --quiet "${want[@]}" --index-url https://download.pytorch.org/whl/cpu >&2
      torch_wheel="$(ls "$cache"/wheels/torch-2.13.0+cpu-cp${python/./}-*.whl)"
    fi
  fi
  say "debootstrap $suite (Python $python, build tools) into $rootfs"
  # shellcheck disable=SC2086  # DEBIAN_MIRROR: empty (debootstrap's default) or one URL
  debootstrap --variant=minbase --cache-dir="$cache/debs" \
    --include=python3,python3-pip,libpython$python,ca-certificates,build-essential,git,gnupg2 \
    "$suite" "$rootfs" ${DEBIAN_MIRROR:-} >"$cache/debootstrap.log" 2>&1 ||
    { tail -20 "$cache/debootstrap.log" >&2; return 1; }
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/build-machine-ca.crt"
  cp -L /etc/resolv.conf "$rootfs/etc/resolv.conf"
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  # NGC's Python packages are pip's, in the interpreter's own site-packages. Debian's go to
  # /usr/lib/python3/dist-packages, where uv does not look (it would install a second copy over
  # them) and pip cannot upgrade them (no RECORD): pip moves where NGC has its packages, the
  # rest of Debian's Python packages (pip's setuptools and wheel) go.
  local site="$rootfs/usr/local/lib/python$python/dist-packages" entry
  mkdir -p "$site"
  for entry in "$rootfs"/usr/lib/python3/dist-packages/*; do
    if [[ "$(basename "$entry")" =~ ^pip([-.].*)?$ ]]; then
      mv "$entry" "$site"/
    else
      rm -rf "$entry"
    fi
  done
  cp "$torch_wheel" "$rootfs/tmp/"
  say "tritonserver, xgrammar, transformers and the tensorrt_llm stand-in (pip)"
  chroot "$rootfs" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin \
    SSL_CERT_FILE=/etc/ssl/build-machine-ca.crt PIP_CERT=/etc/ssl/build-machine-ca.crt \
    PYTHON="$python" /bin/bash -euo pipefail -c "$(cat <<'INSIDE'
pip=(python3 -m pip install --quiet --no-input --disable-pip-version-check --root-user-action=ignore)
# tritonserver + python backend from the wheel, laid out as in NGC's image.
"${pip[@]}" --no-deps --target /opt/pytriton nvidia-pytriton==0.7.0
wheel=/opt/pytriton/pytriton/tritonserver
stub="$wheel/python_backend_stubs/$PYTHON/triton_python_backend_stub"
mkdir -p /opt/tritonserver/bin /opt/tritonserver/backends/python
ln -s "$wheel/bin/tritonserver" /opt/tritonserver/bin/tritonserver
ln -s "$wheel/backends/python/libtriton_python.so" "$wheel/backends/python/triton_python_backend_utils.py" \
  "$stub" /opt/tritonserver/backends/python/
# torch (CPU build) with its dependencies; numpy < 2 as TensorRT-LLM has it.
"${pip[@]}" /tmp/torch-*.whl 'numpy<2'
rm /tmp/torch-*.whl
# xgrammar without its GPU kernel compiler (`triton`), with what it imports (as in
# requirements-guided.txt); transformers with it, as NGC's TensorRT-LLM has.
"${pip[@]}" 'transformers>=4.53,<6' 'tokenizers>=0.20' 'pydantic>=2.7,<3' \
  'apache-tvm-ffi==0.1.15.post2' 'numpy<2'
"${pip[@]}" --no-deps xgrammar==0.2.8
# The tensorrt_llm stand-in: importable, with a version, installed where pip would put it.
site="$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
mkdir -p "$site/tensorrt_llm" "$site/tensorrt_llm-0.0.0+standin.dist-info"
cat > "$site/tensorrt_llm/__init__.py" <<'PY'
"""A stand-in for TensorRT-LLM in the NGC-like test image: proves the import path, nothing more."""

__version__ = "0.0.0+standin"
PY
printf 'Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 0.0.0+standin\n' \
  > "$site/tensorrt_llm-0.0.0+standin.dist-info/METADATA"
echo pip > "$site/tensorrt_llm-0.0.0+standin.dist-info/INSTALLER"
python3 -c 'import importlib.metadata as m, tensorrt_llm, torch, xgrammar
print("python3:", *(f"{n} {m.version(n)}" for n in ("tensorrt_llm", "torch", "xgrammar")))'
INSIDE
)" >&2
  rm -rf "$rootfs/etc/resolv.conf" "$rootfs/root/.cache"
  say "writing $tarball"
  rm -f "$cache"/ngc-like-*.tar
  tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
  rm -rf "$rootfs"
}

[ -f "$tarball" ] || build_root_file_system
say "importing $tarball as $name"
wheel_libs="/opt/pytriton/nvidia_pytriton.libs"
podman import \
  --change "ENV PATH=/opt/tritonserver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change "ENV LD_LIBRARY_PATH=$wheel_libs" \
  --change "ENV SSL_CERT_FILE=/etc/ssl/build-machine-ca.crt" \
  --change "ENV PIP_CERT=/etc/ssl/build-machine-ca.crt" \
  --change "ENV REQUESTS_CA_BUNDLE=/etc/ssl/build-machine-ca.crt" \
  --change "ENV UV_SYSTEM_CERTS=1" \
  --change "CMD [\"/bin/bash\"]" \
  "$tarball" "$name" >/dev/null
podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/bentotrtllm-ngc-like:' |
  grep -v ":$key\$" | xargs -r podman rmi --force >/dev/null 2>&1 || true
echo "$name"
