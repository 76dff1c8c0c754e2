"""What only the tests and the scripts use, kept out of the installed package: `helpers` (wait_until,
Processes, traffic generators, a small disk), `docker_launcher` (the cluster in containers, with
faults; its client programs run in the roq:test image, which docker/build-images.sh copies it into),
`hostile` (peers that speak the wire formats badly on purpose) and `fuzz_targets` (the fuzzed
decoders, scripts/fuzz.py)."""
