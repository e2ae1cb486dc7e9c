#!/usr/bin/env bash
# Fill .carry-vk/ (git-ignored: .git/info/exclude lists /.carry-vk/) with what scripts/gpu/vulkan.sh needs on a lent
# GPU machine that has NVIDIA's Vulkan ICD but no Vulkan loader, no glslc and no network: Debian packages, as .debs
# (vulkan.sh unpacks them with dpkg-deb -x, nothing is installed there):
#   - bookworm (this machine's suite, glibc 2.36: runs on Ubuntu 24.04's 2.39): libvulkan1 (the loader),
#     glslc + libshaderc1 (its one library beyond libc/libstdc++, per ldd), spirv-headers (CMake config + headers),
#     vulkan-tools (vulkaninfo) and the libraries vulkaninfo links that a server may lack (per ldd: wayland, X11,
#     xcb, Xau, Xdmcp, bsd, md, ffi; vulkan.sh uses them only where the system has none);
#   - trixie's libvulkan-dev 1.4.309 from the Debian pool, sha256 pinned as in .ci/run (the headers ggml needs).
# Usage (on the Debian machine, from the repository root): bash scripts/gpu/carry-vk.sh   (about 8 MB)
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.carry-vk
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
(cd "$dest.tmp" && apt-get download -q libvulkan1 glslc libshaderc1 spirv-headers vulkan-tools \
    libwayland-client0 libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 libffi8 libx11-data)
url=$(sed -n 's/^VULKAN_HEADERS_DEB_URL=//p' .ci/run)
sha=$(sed -n 's/^VULKAN_HEADERS_DEB_SHA256=//p' .ci/run)
python3 - "$url" "$dest.tmp/$(basename "$url")" "$sha" <<'PY'
import hashlib, sys, urllib.request
url, out, want = sys.argv[1:]
data = urllib.request.urlopen(url, timeout=120).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"{url}: sha256 {got}, expected {want}")
open(out, "wb").write(data)
PY
# plain file names (no %3a epoch escapes): they travel to the lent machine as they are
for f in "$dest.tmp"/*%3a*.deb; do [ -e "$f" ] && mv "$f" "${f//%3a/_}"; done
(cd "$dest.tmp" && sha256sum ./*.deb > SHA256SUMS)
rm -rf "$dest" && mv "$dest.tmp" "$dest"
du -sh "$dest" && ls "$dest"
