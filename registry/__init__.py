from serving.env import settle_ort_telemetry

# ONNX Runtime's telemetry is off before any module of this package loads it (why: serving/__init__.py).
settle_ort_telemetry()
