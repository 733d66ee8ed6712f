"""The descriptor pool that stubhost's generated protobuf modules register their types in.

Not protobuf's default pool: our schemas keep Triton's package name ``inference`` (needed for
wire and JSON compatibility), and tritonclient's generated modules register the same names in the
default pool. One private pool lets both be imported in one process. Message classes from this
pool work with ``text_format`` and ``json_format`` like any others. See scripts/gen_protos.sh.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
