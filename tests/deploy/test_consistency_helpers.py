"""The helpers the deployment checks stand on (tests/deploy/consistency.py) find what
they claim: a check built on a helper that sees nothing could never fail."""

from __future__ import annotations

import pytest

from tests.deploy.consistency import (
    MissingVariable,
    command_problems,
    interpolate,
    metric_names,
    promql_metric_names,
    required_variables,
    settings_read,
)


@pytest.mark.parametrize(("expression", "names"), [
    ('histogram_quantile(0.99, sum by (le, model) (rate(modelops_request_duration_seconds_bucket{model=~"$model"}[$__rate_interval])))',
     {"modelops_request_duration_seconds_bucket"}),
    ('sum(rate(a_total{code=~"5.."}[5m])) by (model) / ignoring(code) group_left sum(rate(b_total[5m]))', {"a_total", "b_total"}),
    ("max by (instance) (gauge_one) offset 5m", {"gauge_one"}),
    ('up{job="workers"} == 1 and on(instance) other_metric', {"up", "other_metric"}),
    ("count_over_time(series_x[5m:1m]) > 1e3", {"series_x"}),
    ("sum without (device) (memory_bytes) / 1024", {"memory_bytes"}),
    ('label_replace(metric_a, "dst", "$1", "src", "(.*)")', {"metric_a"}),
])
def test_promql_metric_names_are_the_selected_metrics_only(expression, names):
    assert promql_metric_names(expression) == names


def test_metric_names_holds_families_and_their_sample_names():
    text = (
        "# TYPE requests counter\nrequests_total{code=\"200\"} 3\n"
        "# TYPE latency histogram\nlatency_bucket{le=\"+Inf\"} 1\nlatency_sum 0.1\nlatency_count 1\n"
    )

    assert metric_names(text) == {"requests", "requests_total", "latency", "latency_bucket", "latency_sum", "latency_count"}


@pytest.mark.parametrize(("argv", "problem"), [
    (["python", "manage.py", "no_such_command"], "no command"),
    (["python", "manage.py", "serve", "--prot", "8001"], "refuses its arguments"),
    (["python", "-m", "serving.no_such_module"], "no module"),
    (["uvicorn", "console.asgi:no_such_app"], "defines no"),
    (["python", "-m", "uvicorn", "console.asgi:application", "--no-such-option"], "refuses its arguments"),
    (["celery", "worker"], "without -A"),
    (["celery", "-A", "console", "worker", "--queues", "nobody-routes-here"], "no task is routed"),
    (["celery", "-A", "console", "worker", "--no-such-option"], "no option"),
    (["sh", "-c", "python manage.py migrate && python manage.py no_such_command"], "no command"),
    (["gunicorn", "console.wsgi"], "not a program"),
])
def test_command_problems_names_what_would_not_run(argv, problem):
    problems = command_problems(argv)

    assert problems and problem in " ".join(problems)


@pytest.mark.parametrize("argv", [
    ["sh", "-c", "python manage.py migrate --noinput && exec python -m uvicorn console.asgi:application --host 0.0.0.0 --port 8000"],
    ["python", "manage.py", "serve", "--host", "0.0.0.0", "--port", "8001", "--public-url", "http://w:8001"],
    ["celery", "-A", "console", "worker", "--queues", "jobs", "--concurrency", "1"],
    ["python", "-m", "serving.worker", "--port", "8001"],
])
def test_command_problems_accepts_the_projects_commands(argv):
    assert command_problems(argv) == []


def test_settings_read_holds_the_console_and_worker_settings():
    assert {"DATABASE_URL", "REDIS_URL", "SERVING_WORKER_TOKEN", "CONSOLE_URL", "SERVING_DEVICE"} <= settings_read()
    assert "NOT_A_SETTING_ANYWHERE" not in settings_read()


@pytest.mark.parametrize(("text", "environment", "expected"), [
    ("${A:-d}", {}, "d"), ("${A:-d}", {"A": ""}, "d"), ("${A-d}", {"A": ""}, ""), ("${A:-d}", {"A": "v"}, "v"),
    ("$$HOME and $${B}", {}, "$HOME and ${B}"), ("x${A:+alt}", {"A": "1"}, "xalt"), ("x${A:+alt}", {}, "x"), ("$A/${A}", {"A": "v"}, "v/v"),
])
def test_interpolation_follows_compose(text, environment, expected):
    assert interpolate({"key": [text]}, environment) == {"key": [expected]}


def test_a_required_variable_unset_or_empty_is_refused_and_named():
    assert required_variables("${A:?set A} ${B?set B} ${C:-c}") == {"A", "B"}
    with pytest.raises(MissingVariable, match="A: set A"):
        interpolate("${A:?set A}", {"A": ""})
    assert interpolate("${B?set B}", {"B": ""}) == ""
