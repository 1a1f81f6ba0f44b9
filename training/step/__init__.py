"""One optimizer step on the workers: the batch plan and memory planner, FSDP2 sharding and the
mesh, the engine that runs a step, the learning-rate schedule and throughput/MFU accounting."""
