"""A Temporal worker process for the crash tests: runs `temporal_flows`' workflows and
activities until it dies in its crash window (`crash_point`) or is killed."""

from __future__ import annotations

import asyncio
import os

from crash_point import standby
from temporal_flows import TASK_QUEUE, TEMPORAL, worker_options
from temporalio.client import Client
from temporalio.worker import Worker


async def main() -> None:
    client = await Client.connect(os.environ[TEMPORAL])
    worker = Worker(client, **worker_options(os.environ[TASK_QUEUE]))
    await worker.run()


if __name__ == "__main__":
    standby()  # a replacement started early waits here, imports done, until released
    asyncio.run(main())
