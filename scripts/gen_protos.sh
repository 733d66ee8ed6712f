#!/usr/bin/env bash
# Regenerates the Python modules (and .pyi stubs) for stubhost's .proto files.
#
# The generated files are committed: grpcio-tools is needed only by whoever edits a .proto, never
# to build or install stubhost. Run from anywhere: `bash scripts/gen_protos.sh`.
#
# To add a schema, put its path (relative to src/) in PROTOS. A proto that imports another names
# it by that same src/-relative path, e.g. `import "stubhost/config/model_config.proto";`.
#
# Generated modules register their types in stubhost's own descriptor pool
# (stubhost/config/_proto_pool.py), not in protobuf's process-wide default pool. Our schemas use
# Triton's package name `inference`, and so do tritonclient's generated modules; two different
# files defining `inference.ModelConfig` in one pool make the second import fail, so sharing the
# default pool would break any process that imports both (a test driving the server with
# tritonclient, a client embedding the in-process API).
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOS=(
  stubhost/config/model_config.proto
  stubhost/server/grpc_service.proto
)
# Extra protoc output flags per proto (e.g. --grpc_python_out=src for a service definition).
declare -A EXTRA_OUT=(
)

for proto in "${PROTOS[@]}"; do
  # shellcheck disable=SC2086
  python3 -m grpc_tools.protoc -I src --python_out=src --pyi_out=src ${EXTRA_OUT[$proto]:-} "src/$proto"
  module="src/${proto%.proto}_pb2.py"
  # Point the generated module at stubhost's pool (see above). Fail loudly if protoc's output
  # ever stops containing the line this rewrites.
  grep -q '^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(' "$module" || {
    echo "gen_protos: $module: unexpected protoc output, cannot redirect it to stubhost's pool" >&2
    exit 1
  }
  sed -i \
    -e 's/^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(/DESCRIPTOR = _proto_pool.POOL.AddSerializedFile(/' \
    -e 's/^from google.protobuf import descriptor_pool as _descriptor_pool$/from stubhost.config import _proto_pool/' \
    "$module"
  echo "generated ${module#src/} and its .pyi"
done
