#!/usr/bin/env bash
# For a GPU host that cannot download (the lent accelerator machine): fetch here, on a machine with the
# package registries, the wheels the GPU benchmarks need beside the host's own torch / transformers, and
# carry the folder over.  Then, on the GPU host, `source benchmark/gpu/carry/offline_env.sh WHEELS` installs them
# and sets the environment one_gpu.sh / overhead.py / multi_gpu.sh need.
#
#   benchmark/gpu/carry/offline_wheels.sh [WHEELS]      # default WHEELS: .whl (git-ignored)
#
# starlette and uvicorn serve the OpenAI API (the host has their own dependencies: anyio, h11, click).
# PYVER (3.12: the GPU host's Python) picks the binary wheels.  nvidia-pytriton's wheel (55 MB) is
# slimmed to 39 MB: the libpython 3.13 it bundles and the python-backend stubs of other Pythons are
# dropped (and from its RECORD), so that the folder fits a 64 MiB carry with numpy.
set -euo pipefail
cd "$(dirname "$0")/../../.."
WHEELS=${1:-.whl}
PYVER=${PYVER:-3.12}
mkdir -p "$WHEELS"
tag=${PYVER/./}
pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --dest "$WHEELS" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_35_x86_64 \
    nvidia-pytriton==0.7.0 "numpy==1.26.4" tritonclient==2.73.0 hydra-core==1.3.8 omegaconf==2.3.1 \
    submitit==1.5.4 python-rapidjson==1.25 starlette==1.0.1 uvicorn==0.38.0
# antlr4 4.9.3 (omegaconf's) is published as a source archive only: build its pure-python wheel
pip download -q --no-deps --no-binary=:all: --dest "$WHEELS" antlr4-python3-runtime==4.9.3
pip wheel -q --no-deps --wheel-dir "$WHEELS" "$WHEELS"/antlr4-python3-runtime-4.9.3.tar.gz
rm -f "$WHEELS"/antlr4-python3-runtime-4.9.3.tar.gz
python3 - "$WHEELS" "$PYVER" <<'PY'
import os, re, sys, zipfile
folder, pyver = sys.argv[1], sys.argv[2]
(src,) = [os.path.join(folder, f) for f in os.listdir(folder) if f.startswith("nvidia_pytriton-")]
def drop(name: str) -> bool:
    stub = re.search(r"python_backend_stubs/(3\.\d+)/", name)
    return bool(re.search(r"libpython3-[0-9a-f]+\.13\.so", name) and pyver != "3.13") or bool(stub and stub.group(1) != pyver)
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(src + ".new", "w", zipfile.ZIP_DEFLATED) as zout:
    dropped = 0
    for item in zin.infolist():
        if drop(item.filename):
            dropped += 1
            continue
        data = zin.read(item.filename)
        if item.filename.endswith(".dist-info/RECORD"):
            data = "".join(l + "\n" for l in data.decode().splitlines() if not drop(l.split(",")[0])).encode()
        zout.writestr(item, data)
os.replace(src + ".new", src)
print(f"{os.path.basename(src)}: {dropped} files for other Pythons dropped, {os.path.getsize(src) / 2**20:.0f} MiB")
PY
du -sh "$WHEELS"
