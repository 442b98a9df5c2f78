"""A Satori server (satori-python's, on PORT with TOKEN) whose one platform the test drives.

The test writes JSON lines on stdin:
- {"event": {...}}: posted to every connected client as a Satori event (the server numbers it
  with its `sn` and keeps the last 100 for a client that reconnects with its `sn`);
- {"logins": [...]}: replaces the logins the server reports in READY.
The server writes JSON lines on stdout: {"ready": true} once it listens, and
{"sent": {"platform", "self_id", "channel_id", "content", "id"}} for each `message.create`
(the id it gave the message), and {"channel": {...}} for each `user.channel.create`.
"""

import asyncio
import json
import os
import sys
from datetime import datetime

from satori import Api
from satori.model import Login, LoginStatus, User
from satori.server import Request, Server
from satori.event import Event


class Driven:
    """The platform: its logins, and the events the test posts."""

    def __init__(self) -> None:
        self.logins = []
        self.events: "asyncio.Queue[Event]" = asyncio.Queue()

    async def get_logins(self):
        return [
            Login(
                platform=login["platform"],
                user=User(id=login["self_id"], name=login.get("name", "")),
                status=LoginStatus.ONLINE,
                features=login.get("features", []),
                adapter="test",
            )
            for login in self.logins
        ]

    @staticmethod
    def proxy_urls():
        return []

    def ensure(self, platform: str, self_id: str) -> bool:
        return True

    async def handle_internal(self, request, path):
        raise NotImplementedError

    async def handle_proxied(self, prefix, url):
        return None

    async def publisher(self):
        while True:
            yield await self.events.get()


def say(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


async def main() -> None:
    server = Server(host="127.0.0.1", port=int(os.environ["PORT"]), token=os.environ["TOKEN"])
    driven = Driven()
    server.apply(driven)
    next_id = [5000]

    @server.route(Api.MESSAGE_CREATE)
    async def message_create(request: Request):
        next_id[0] += 1
        message_id = str(next_id[0])
        say(
            {
                "sent": {
                    "platform": request.platform,
                    "self_id": request.self_id,
                    "channel_id": request.params["channel_id"],
                    "content": request.params["content"],
                    "id": message_id,
                }
            }
        )
        return [{"id": message_id, "content": request.params["content"]}]

    @server.route(Api.USER_CHANNEL_CREATE)
    async def user_channel_create(request: Request):
        channel = {"id": f"dm-{request.params['user_id']}", "type": 1}
        say({"channel": channel})
        return channel

    async def read_commands() -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            command = json.loads(line)
            if "logins" in command:
                driven.logins = command["logins"]
            if "event" in command:
                raw = command["event"]
                raw.setdefault("timestamp", int(datetime.now().timestamp() * 1000))
                await driven.events.put(Event.parse(raw))

    async def announce() -> None:
        # The listener is up once a connection to it succeeds.
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", int(os.environ["PORT"]))
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        say({"ready": True})

    # Held, so that they live as long as the server.
    tasks = [asyncio.create_task(read_commands()), asyncio.create_task(announce())]
    await server.run_async()
    for task in tasks:
        task.cancel()


asyncio.run(main())
