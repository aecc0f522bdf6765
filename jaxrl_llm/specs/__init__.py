"""Hardware descriptions the planner compiles for (``jaxrl-llm plan --target``): XLA GPU target
configurations (``GpuTargetConfigProto`` in protobuf text), taken from XLA's own
``xla/backends/gpu/target_config/specs`` as data (each file names its source)."""
