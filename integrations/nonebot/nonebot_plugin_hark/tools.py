"""hark's durable questions as tools of an LLM a NoneBot2 bot runs.

NoneBot2 has no LLM of its own: a bot's LLM comes from a plugin of its own or of the ecosystem.
Whatever runs it can offer the model `TOOLS` (OpenAI's function format) and run the model's calls
with `call_tool(event, name, arguments)`, or call `ask_user` and `approve` directly. Each asks
the person who sent `event`, in the chat it came from, through hark's MCP server
(`hark_mcp_url`, with one of hark's `control.api_tokens` as `hark_mcp_token`), and waits for the
answer. The question is hark's: it is asked in the chat through this plugin, only that person's
reply answers it, and the reply is taken by hark before any other handler sees it.
"""

import asyncio
import hashlib
import json
from typing import Any, Optional

import httpx
from nonebot.adapters.onebot.v11 import GroupMessageEvent, MessageEvent

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ask_user",
            "description": (
                "Ask the person you are talking with a question in this chat, and wait for their"
                " answer. The question stays open until they answer, across restarts; only they"
                " can answer it. If the result says it is still open, call get_answer with its"
                " question_id later instead of asking again."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "question": {"type": "string", "description": "The question, as the person will read it."},
                    "choices": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "The answers the person picks from; leave out for a free answer.",
                    },
                },
                "required": ["question"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "approve",
            "description": (
                "Ask the person you are talking with to approve an action before you take it, and"
                " wait for their decision. Returns whether it was approved, and their reason."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "description": "What you are about to do, as the person will read it."},
                    "details": {"type": "string", "description": "What they should know to decide."},
                },
                "required": ["action"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_answer",
            "description": "Wait again for the answer to a question asked before with ask_user or approve.",
            "parameters": {
                "type": "object",
                "properties": {"question_id": {"type": "string"}},
                "required": ["question_id"],
            },
        },
    },
]


class Tools:
    """The tools, bound to hark's MCP server and the platform hark knows these chats by."""

    def __init__(self, mcp_url: str, mcp_token: str, platform: str, wait_s: float):
        self.mcp_url = mcp_url.strip()
        self.platform = platform
        self.wait_s = wait_s
        headers = {"Accept": "application/json, text/event-stream"}
        if mcp_token:
            headers["Authorization"] = f"Bearer {mcp_token}"
        # hark holds a call for up to its mcp.hold before it says "waiting".
        self.http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(wait_s + 30))
        self.calls = 0

    async def call_tool(self, event: MessageEvent, name: str, arguments: Any) -> str:
        """Runs the model's call of one of `TOOLS`; what the model reads back."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as e:
                return f"The arguments are not JSON: {e}"
        if not isinstance(arguments, dict):
            return "The arguments must be an object."
        if name == "ask_user":
            return await self.ask_user(event, str(arguments.get("question", "")), arguments.get("choices"))
        if name == "approve":
            return await self.approve(event, str(arguments.get("action", "")), str(arguments.get("details", "")))
        if name == "get_answer":
            return await self.wait_for(str(arguments.get("question_id", "")), None)
        return f"hark has no tool {name!r}."

    async def ask_user(self, event: MessageEvent, question: str, choices: Optional[list] = None) -> str:
        arguments: dict = {"question": question}
        if choices:
            arguments["choices"] = [str(c) for c in choices]
        return await self.ask(event, "ask_user", arguments)

    async def approve(self, event: MessageEvent, action: str, details: str = "") -> str:
        arguments: dict = {"action": action}
        if details:
            arguments["details"] = details
        return await self.ask(event, "approve", arguments)

    async def ask(self, event: MessageEvent, tool: str, arguments: dict) -> str:
        if not self.mcp_url:
            return "hark's MCP server is not configured (HARK_MCP_URL); nobody was asked."
        arguments["owner"] = f"{self.platform}:{event.user_id}"
        if isinstance(event, GroupMessageEvent):
            arguments["chat"] = f"group:{event.group_id}"
        # The same call made again (the model retried it) is the same question, not a second one.
        asked = json.dumps(arguments, sort_keys=True, ensure_ascii=False).encode()
        arguments["request_id"] = (
            f"nonebot:{event.self_id}:{event.message_id}:{tool}:" + hashlib.sha256(asked).hexdigest()[:16]
        )
        deadline = asyncio.get_running_loop().time() + self.wait_s
        try:
            result = await self.call(tool, arguments)
        except Exception as e:
            return f"Could not ask through hark: {e}"
        if result.get("status") == "waiting":
            return await self.wait_for(result["question_id"], deadline)
        return read(result)

    async def wait_for(self, question_id: str, deadline: Optional[float]) -> str:
        if not self.mcp_url:
            return "hark's MCP server is not configured (HARK_MCP_URL)."
        loop = asyncio.get_running_loop()
        deadline = deadline if deadline is not None else loop.time() + self.wait_s
        result: dict = {"status": "waiting", "question_id": question_id}
        while result.get("status") == "waiting":
            left = deadline - loop.time()
            if left < 1:
                return (
                    "No answer yet; the question stays open in the chat. Call get_answer with "
                    f'question_id "{question_id}" later; do not ask again.'
                )
            try:
                result = await self.call("get_answer", {"question_id": question_id, "wait_s": int(left)})
            except Exception as e:
                return f'Could not reach hark: {e}. Call get_answer with question_id "{question_id}" later.'
        return read(result)

    async def call(self, tool: str, arguments: dict) -> dict:
        """One call of a tool of hark's MCP server (stateless: no session to open first); its
        structured result, with its text as `text`."""
        self.calls += 1
        response = await self.http.post(
            self.mcp_url,
            json={
                "jsonrpc": "2.0",
                "id": self.calls,
                "method": "tools/call",
                "params": {"name": tool, "arguments": arguments},
            },
        )
        if response.status_code != 200:
            raise RuntimeError(f"hark's MCP server answered {response.status_code}: {response.text[:200]}")
        answer = None
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            for line in response.text.splitlines():
                if line.startswith("data:"):
                    data = json.loads(line[5:].strip() or "null")
                    if isinstance(data, dict) and data.get("id") == self.calls:
                        answer = data
        else:
            answer = response.json()
        if not isinstance(answer, dict):
            raise RuntimeError("hark's MCP server gave no answer")
        if "error" in answer:
            raise RuntimeError(answer["error"].get("message", "the call failed"))
        result = answer.get("result") or {}
        text = "".join(part.get("text", "") for part in result.get("content", []))
        if result.get("isError"):
            raise RuntimeError(text or "the tool failed")
        out = dict(result.get("structuredContent") or {})
        out["text"] = text
        return out

    async def close(self) -> None:
        await self.http.aclose()


def read(result: dict) -> str:
    """What the model reads of a tool's result."""
    if "approved" in result:
        verdict = "approved" if result["approved"] else "not approved"
        reason = result.get("reason")
        return f"{verdict}: {reason}" if reason else verdict
    answer = result.get("answer")
    if isinstance(answer, dict) and "decision" in answer:
        verdict = "approved" if str(answer["decision"]).startswith("approve") else "not approved"
        reason = answer.get("reason")
        return f"{verdict}: {reason}" if reason else verdict
    if result.get("text"):
        return result["text"]
    if result.get("status") == "answered":
        return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
    return f"The question was {result.get('status', 'closed')}; no answer will come."
