"""AWS Lambda Powertools' Redis idempotency layer, driven outside Lambda as the baseline.

We call its persistence layer exactly as its `IdempotencyHandler` does for a first execution:
`save_inprogress(data, remaining_time_in_millis)` (a `SET NX EX`), then `save_success(data,
result)` (a `SET EX`), with payload hashing (md5 of the JSON payload) done inside the layer as in
production. `remaining_time_in_millis` stands in for the Lambda context (30 s left, our lease).
Powertools is synchronous: concurrency is threads sharing one redis-py client, which is how a
threaded Python service would use it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, cast

import redis

os.environ.setdefault("AWS_LAMBDA_FUNCTION_NAME", "mcp-once-bench")
os.environ.setdefault("POWERTOOLS_IDEMPOTENCY_DISABLED", "false")


def unavailable_reason() -> str | None:
    """None when the baseline can run, else why not (printed, so a missing baseline is loud).

    Powertools' idempotency package imports its DynamoDB layer, hence boto3, even for Redis."""
    try:
        import aws_lambda_powertools.utilities.idempotency.persistence.redis  # noqa: F401
    except ImportError as exc:
        return (
            f"AWS Powertools cannot be imported ({exc}); install the bench group:"
            " uv run --group bench ..."
        )
    return None


def available() -> bool:
    return unavailable_reason() is None


def version() -> str:
    from aws_lambda_powertools.shared.version import VERSION

    return str(VERSION)


class PowertoolsLayer:
    """One configured `RedisCachePersistenceLayer` on its own connection pool."""

    def __init__(self, url: str, *, expires_after_seconds: int = 3600) -> None:
        from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            RedisCachePersistenceLayer,
        )

        # decode_responses=True is what Powertools' own connection helper uses.
        self.client = redis.Redis.from_url(url, decode_responses=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            self.layer = RedisCachePersistenceLayer(client=cast(Any, self.client))
        self.layer.configure(
            IdempotencyConfig(expires_after_seconds=expires_after_seconds), function_name="charge"
        )

    def first_execution(self, data: dict[str, Any], result: dict[str, Any]) -> None:
        self.layer.save_inprogress(data=data, remaining_time_in_millis=30_000)
        self.layer.save_success(data=data, result=result)

    def replay(self, data: dict[str, Any]) -> Any:
        """What `IdempotencyHandler` does for a completed key: the claim fails, it reads the
        record (inside the layer), then reads it again (`get_record`)."""
        from aws_lambda_powertools.utilities.idempotency.exceptions import (
            IdempotencyItemAlreadyExistsError,
        )

        try:
            self.layer.save_inprogress(data=data, remaining_time_in_millis=30_000)
        except IdempotencyItemAlreadyExistsError:
            record = self.layer.get_record(data=data)
            return record.response_json_as_dict() if record is not None else None
        raise RuntimeError("the key was not completed: this was not a replay")

    def close(self) -> None:
        self.client.close()
