"""Background jobs: one ``Job`` row per job, run by the Celery task ``registry.tasks.run_job``.

``records`` moves a job between states and relays it live; ``runner`` runs one job
(claim, heartbeat, the kind's handler); ``child`` runs a job's ONNX work in a fresh
interpreter (``python -m serving.jobs``); one module per kind holds its handler.
"""
