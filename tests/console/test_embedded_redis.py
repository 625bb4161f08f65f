"""The embedded Redis requires its generated password, and a REDIS_URL with credentials
works for every client the stack uses (redis-py, channels-redis, Celery's kombu)."""

from __future__ import annotations

import stat

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from console import embedded_redis


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("redis")
    process, url = embedded_redis.start(data_dir)
    yield data_dir, process, url
    embedded_redis.stop(process)


def test_embedded_redis_refuses_a_client_without_the_password(server):
    _, _, url = server
    port = redis.Redis.from_url(url).connection_pool.connection_kwargs["port"]

    no_retry = Retry(NoBackoff(), 0)  # redis-py retries a refused AUTH with back-off: 10 s for nothing
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, retry=no_retry).ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, password="guessed", socket_timeout=2, retry=no_retry).ping()


def test_embedded_redis_accepts_the_generated_password_kept_in_a_private_file(server):
    data_dir, process, url = server
    password_file = data_dir / embedded_redis.PASSWORD_FILE

    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert url.startswith(f"redis://:{password_file.read_text().strip()}@127.0.0.1:")
    assert redis.Redis.from_url(url, socket_timeout=2).ping() is True
    assert password_file.read_text().strip() not in open(f"/proc/{process.pid}/cmdline").read()


def test_the_password_is_generated_once(tmp_path):
    first = embedded_redis.generated_password(tmp_path / "redis_password")

    assert embedded_redis.generated_password(tmp_path / "redis_password") == first
    assert len(first) >= 40


async def test_channels_redis_works_with_a_url_carrying_the_password(server):
    from channels_redis.core import RedisChannelLayer

    layer = RedisChannelLayer(hosts=[server[2]], prefix="test-embedded")
    channel = await layer.new_channel()
    await layer.group_add("serving", channel)
    await layer.group_send("serving", {"type": "serving.apply", "state": {"generation": 1}})

    assert await layer.receive(channel) == {"type": "serving.apply", "state": {"generation": 1}}
    await layer.flush()
    await layer.close_pools()


def test_celery_broker_connects_with_a_url_carrying_the_password(server):
    from kombu import Connection

    with Connection(server[2], connect_timeout=2) as connection:
        connection.ensure_connection(max_retries=1)
        assert connection.connected


def test_a_free_port_is_none_of_those_chosen_for_something_not_listening_yet():
    # The stack's own ports are free until its console and worker bind them: a Redis
    # started on the console's port answered the console's health check.
    avoided = frozenset(embedded_redis.PICKED_FROM)

    assert embedded_redis.free_port(avoided) not in avoided
