#!/bin/sh
# Writes the image's hash-checked pins from the project's own declarations:
#   deploy/requirements.lock  what gpubot runs on (pyproject.toml's dependencies, at the
#                             versions constraints.txt pins), for Python 3.11 on Linux;
#   deploy/build.lock         what builds gpubot's wheel (pyproject.toml's build-system).
# Every file of every pinned version is hashed, so the image installs with --require-hashes on
# any Linux architecture. Run from anywhere after changing a dependency or constraints.txt;
# needs uv (`pip install uv`) and the package index.
set -eu
cd "$(dirname "$0")/.."
uv="${UV:-uv}"
UV_CUSTOM_COMPILE_COMMAND="deploy/lock.sh"
export UV_CUSTOM_COMPILE_COMMAND
"$uv" pip compile --quiet pyproject.toml --constraint constraints.txt --generate-hashes \
    --python-version 3.11 --python-platform linux --output-file deploy/requirements.lock
python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' \
    >deploy/build.in
"$uv" pip compile --quiet deploy/build.in --generate-hashes \
    --python-version 3.11 --python-platform linux --output-file deploy/build.lock
rm -f deploy/build.in
