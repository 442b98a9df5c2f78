"""What an MCP client sees of hark, measured with the official Python SDK from a separate process.

    python bench.py MCP_URL KEY ADAPTER_URL PLATFORM USER [N]

with the adapter's token, if it has one, in HARK_ADAPTER_TOKEN, and its bot in HARK_ADAPTER_BOT
(`main` unless set; `playground` for `hark dev`).

The person is `PLATFORM:USER`, who answers through hark's HTTP adapter (a chat platform as any
other). For each of N questions, one after another:
- ask: from the `ask_user` call to its question being open (seen by `list_questions` on a second
  connection, polled every 2 ms);
- answer: from the person's answer being accepted by the gateway (202) to the `ask_user` call
  returning it.
Prints the percentiles of both, in milliseconds. Run hark with `mcp.max_per_minute_per_key = 0`
(HARK_MCP__MAX_PER_MINUTE_PER_KEY=0) for more than 30 questions a minute.
"""

import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
import uuid

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def say(adapter: str, platform: str, user: str, text: str) -> None:
    body = json.dumps(
        {
            "platform": platform,
            "bot_id": os.environ.get("HARK_ADAPTER_BOT", "main"),
            "stream": f"private:{user}",
            "sender": {"user_id": user, "nickname": user},
            "text": text,
            "message_id": str(uuid.uuid4()),
        }
    ).encode()
    headers = {"Content-Type": "application/json"}
    if os.environ.get("HARK_ADAPTER_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['HARK_ADAPTER_TOKEN']}"
    request = urllib.request.Request(adapter, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request) as response:
        assert response.status == 202, response.status


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def main() -> None:
    url, key, adapter, platform, user = sys.argv[1:6]
    n = int(sys.argv[6]) if len(sys.argv) > 6 else 20
    say(adapter, platform, user, "hello")
    headers = {"Authorization": f"Bearer {key}"}
    asks, answers = [], []
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120.0)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as asker, Client(
            streamable_http_client(url, http_client=http)
        ) as watcher:
            # Until hark has seen the person in their chat, it has nowhere to ask them.
            while (await asker.call_tool("notify", {"text": "benchmark starting"})).is_error:
                await asyncio.sleep(0.01)
            for i in range(n):
                start = time.perf_counter()
                call = asyncio.create_task(asker.call_tool("ask_user", {"question": f"Question {i}?"}))
                while True:
                    if call.done():
                        raise SystemExit(f"ask_user returned before its question was open: {call.result()}")
                    listed = await watcher.call_tool("list_questions", {})
                    if listed.structured_content["questions"]:
                        break
                    await asyncio.sleep(0.002)
                asks.append((time.perf_counter() - start) * 1000)
                await asyncio.to_thread(say, adapter, platform, user, f"answer {i}")
                answered = time.perf_counter()
                result = await call
                answers.append((time.perf_counter() - answered) * 1000)
                assert result.structured_content["status"] == "answered", result
    for name, values in (("ask -> question open", asks), ("answer accepted -> call returns", answers)):
        print(
            f"{name:32} n={len(values)} p50={statistics.median(values):7.1f} ms "
            f"p90={pct(values, 90):7.1f} ms max={max(values):7.1f} ms"
        )


asyncio.run(main())
