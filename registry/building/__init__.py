"""ONNX models made offline by the project's own code: the demo models and the ones tests and benchmarks build."""
