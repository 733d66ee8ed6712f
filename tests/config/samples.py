"""config.pbtxt texts shaped like the ones Triton users write (python_backend examples, server
QA models): every one must parse, survive the JSON round trip and, where marked, validate."""

from __future__ import annotations

ADD_SUB = """
# Two FP32 vectors in, their sum and difference out.
name: "add_sub"
backend: "python"

input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]

instance_group [{ kind: KIND_CPU }]
"""

DYNAMIC_BATCHING = """
name: "batched"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 5000000
    allow_timeout_override: true
    max_queue_size: 16
  }
  priority_queue_policy {
    key: 2
    value: {
      timeout_action: DELAY
      default_timeout_microseconds: 1000000
      max_queue_size: 4
    }
  }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

SEQUENCE_BATCHING = """
name: "accumulate"
backend: "python"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest {
    max_candidate_sequences: 4
    preferred_batch_size: [ 2, 4 ]
    max_queue_delay_microseconds: 1000
  }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ENSEMBLE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 256
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 1000 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess"
      model_version: -1
      input_map { key: "INPUT_0" value: "IMAGE" }
      output_map { key: "OUTPUT_0" value: "pixels" }
    },
    {
      model_name: "classifier"
      model_version: 3
      input_map { key: "input" value: "pixels" }
      output_map { key: "output" value: "SCORES" }
    }
  ]
}
"""

GPU_GROUPS_AND_PARAMETERS = """
name: "on_gpus"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] } ]
instance_group [
  { name: "gpu_group" kind: KIND_GPU count: 2 gpus: [ 0, 1 ] },
  { kind: KIND_CPU count: 1 }
]
parameters: {
  key: "EXECUTION_ENV_PATH"
  value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" }
}
parameters [
  { key: "tokenizer" value: { string_value: "bert-base-uncased" } },
  { key: "max_length" value: { string_value: "128" } }
]
"""

DECOUPLED = """
name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy {
  decoupled: True
}
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [{ kind: KIND_CPU }]
"""

SCALAR_RESHAPE = """
name: "scalar"
backend: "python"
max_batch_size: 16
input [ { name: "X" data_type: TYPE_FP64 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "Y" data_type: TYPE_FP64 dims: [ 2, 3 ] reshape: { shape: [ 6 ] } } ]
version_policy: { specific: { versions: [ 1, 3 ] } }
"""

# Every other section of the schema, so that parsing and the JSON round trip cover it all.
# Parses and round-trips; not meant to validate (it asks for TensorRT-only features).
KITCHEN_SINK = """
name: "everything"
platform: "tensorrt_plan"
backend: "tensorrt"
runtime: "libtriton_tensorrt.so"
version_policy: { latest: { num_versions: 2 } }
max_batch_size: 32
input [
  {
    name: "IMAGE"
    data_type: TYPE_FP16
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    is_shape_tensor: false
    optional: true
    is_non_linear_format_io: true
  }
]
output [
  { name: "LABELS" data_type: TYPE_BF16 dims: [ 1000 ] label_filename: "labels.txt" }
]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "OFFSETS" data_type: TYPE_INT32 source_input: "IMAGE" }
]
batch_output [
  { target_name: "LABELS" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "IMAGE" }
]
optimization {
  graph { level: 1 }
  priority: PRIORITY_MAX
  cuda {
    graphs: true
    busy_wait_events: true
    graph_spec [
      {
        batch_size: 4
        input { key: "IMAGE" value: { dim: [ 3, 224, 224 ] } }
        graph_lower_bound { batch_size: 1 input { key: "IMAGE" value: { dim: [ 3, 64, 64 ] } } }
      }
    ]
    output_copy_stream: true
  }
  execution_accelerators {
    gpu_execution_accelerator: [
      { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }
    ]
    cpu_execution_accelerator: [ { name: "openvino" } ]
  }
  input_pinned_memory { enable: false }
  output_pinned_memory { enable: true }
  gather_kernel_buffer_threshold: 4
  eager_batching: true
}
sequence_batching {
  direct { max_queue_delay_microseconds: 200 minimum_slot_utilization: 0.5 }
  iterative_sequence: true
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ -1 ]
            initial_state: { data_type: TYPE_FP32 dims: [ 4 ] data_file: "state.bin" name: "from_file" }
            use_same_buffer_for_input_output: true use_growable_memory: true } ]
}
instance_group [
  {
    name: "trt"
    kind: KIND_GPU
    count: 1
    gpus: [ 0 ]
    rate_limiter {
      resources [ { name: "R1" global: true count: 2 }, { name: "R2" count: 1 } ]
      priority: 2
    }
    secondary_devices [ { kind: KIND_NVDLA device_id: 1 } ]
    profile: [ "0", "1" ]
    passive: false
    host_policy: "policy_a"
  }
]
default_model_filename: "model.plan"
cc_model_filenames { key: "7.5" value: "model_t4.plan" }
metric_tags { key: "team" value: "vision" }
parameters { key: "p" value: { string_value: "v" } }
model_warmup [
  {
    name: "warm"
    batch_size: 2
    inputs { key: "IMAGE" value: { data_type: TYPE_FP16 dims: [ 3, 224, 224 ] random_data: true } }
    count: 3
  }
]
model_operations { op_library_filename: [ "libcustom.so" ] }
model_transaction_policy { decoupled: false }
model_repository_agents {
  agents [ { name: "checksum" parameters { key: "MD5:model.plan" value: "abc" } } ]
}
response_cache { enable: false }
model_metrics {
  metric_control [
    {
      metric_identifier { family: "nv_inference_first_response_histogram_ms" }
      histogram_options { buckets: [ -5.0, 0, 2.5, 10 ] }
    }
  ]
}
"""

# name -> (text, folder name it validates under, or None when it is not meant to validate)
ALL = {
    "add_sub": (ADD_SUB, "add_sub"),
    "dynamic_batching": (DYNAMIC_BATCHING, "batched"),
    "sequence_batching": (SEQUENCE_BATCHING, "accumulate"),
    "ensemble": (ENSEMBLE, "pipeline"),
    "gpu_groups_and_parameters": (GPU_GROUPS_AND_PARAMETERS, "on_gpus"),
    "decoupled": (DECOUPLED, "repeat_int32"),
    "scalar_reshape": (SCALAR_RESHAPE, "scalar"),
    "kitchen_sink": (KITCHEN_SINK, None),
}
