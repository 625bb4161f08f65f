"""Background jobs that run a model over a file: `python -m serving.jobs <command> ...`.

The console's Celery worker starts each job as a child process of its own
(registry/jobs/child.py) and reads the JSON lines it prints (serving/jobs/protocol.py).
This package imports no Django, registry or console; importing it is cheap, so the
console can use the upload-time checks of serving/jobs/formats.py (numpy only)."""
