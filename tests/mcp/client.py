"""Calls one tool of an MCP server over streamable HTTP with the official Python SDK (`mcp`, pinned
in requirements.txt), and prints what came back as one JSON line.

    python client.py URL BEARER TOOL ARGUMENTS_JSON [REQUEST_ID]

REQUEST_ID, when given, goes in the call's `_meta["hark/request-id"]`.
"""

import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    url, bearer, tool, arguments = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    meta = {"hark/request-id": sys.argv[5]} if len(sys.argv) > 5 else None
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(300.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=300) as client:
            if tool == "tools/list":
                listed = await client.list_tools()
                print(json.dumps({"tools": [t.name for t in listed.tools]}))
                return
            result = await client.call_tool(tool, arguments, meta=meta)
            text = "".join(c.text for c in result.content if getattr(c, "type", "") == "text")
            print(
                json.dumps(
                    {
                        "is_error": bool(result.is_error),
                        "text": text,
                        "structured": result.structured_content,
                    }
                )
            )


asyncio.run(main())
