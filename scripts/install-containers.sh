#!/usr/bin/env bash
# Install what tests/integration/test_container.py builds and runs containers with: podman and
# runc (its image builds and containers), debootstrap (the NGC-like base image's root file
# system), from Debian's packages. Also writes the podman settings this kind of machine needs
# into .container-cache/containers.conf (ignored by git; used through CONTAINERS_CONF, so the
# machine's own /etc/containers stays as it is): runc with cgroupfs (crun and the systemd cgroup
# manager fail on these machines' cgroups), no default ulimits (the sandbox refuses raising
# them), events in a file (no journald). Needs root and apt; elsewhere it says so and leaves the
# container test to skip.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.container-cache"
tools=(podman runc debootstrap)
missing=()
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "install-containers: ${missing[*]} missing, and installing them needs root and apt-get:" \
      "the container test will skip" >&2
    exit 0
  fi
  echo "install-containers: installing podman, runc, debootstrap (Debian's packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq podman runc debootstrap uidmap slirp4netns fuse-overlayfs >/dev/null
fi
mkdir -p "$cache"
cat > "$cache/containers.conf.new" <<'CONF'
# Written by scripts/install-containers.sh; podman reads it through CONTAINERS_CONF.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
mv "$cache/containers.conf.new" "$cache/containers.conf"
