from serving.env import settle_ort_telemetry

# ONNX Runtime (1.31) keeps a telemetry queue for upload (session details, errors, a device
# id) in ~/.cache/Microsoft/DeveloperTools/.onnxruntime, outside DATA_DIR. It reads this
# variable when it loads, so it is settled before any module of this package imports it; an
# operator's own value wins.
settle_ort_telemetry()
