"""The bottom layer: the env contract, tensor and observation specs, robot specs, durable writes, checksums and
memory accounting. It imports nothing else from robotrl; every other package may import it."""
