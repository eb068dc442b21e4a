#!/usr/bin/env bash
# Installs the CuTe/CUTLASS headers from PyPI (nvidia-cutlass==4.2.0.0) into third_party/cutlass (git-ignored).
# Only the headers are kept: include/ and tools/util/include/. Does nothing when they are already there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/third_party/cutlass"
version="4.2.0.0"
if [ -f "$dest/include/cute/tensor.hpp" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cutlass==$version" -d "$tmp"
python3 - "$tmp" "$dest" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "nvidia_cutlass-*.whl"))[0]
prefixes = ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/")
shutil.rmtree(dest, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefixes) and not name.endswith("/"):
            target = os.path.join(dest, name[len("cutlass_library/source/"):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
PY
echo "$version" > "$dest/VERSION"
echo "CuTe/CUTLASS $version headers installed in $dest"
