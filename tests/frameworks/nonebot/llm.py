"""The bot's own LLM, as a plugin of a NoneBot2 bot runs one (NoneBot has none of its own): each
message that reaches it goes, with the chat's history, to an OpenAI-compatible model at
NONEBOT_LLM_URL offered hark's tools, and the model's calls are run with
nonebot_plugin_hark.call_tool."""

import os

import httpx
from nonebot import on_message
from nonebot.adapters.onebot.v11 import MessageEvent

import nonebot_plugin_hark as hark

llm = on_message(priority=10)
URL = os.environ["NONEBOT_LLM_URL"].rstrip("/") + "/chat/completions"
history: "dict[str, list]" = {}


@llm.handle()
async def _(event: MessageEvent) -> None:
    messages = history.setdefault(event.get_session_id(), [])
    messages.append({"role": "user", "content": event.get_plaintext()})
    async with httpx.AsyncClient(timeout=120) as http:
        for _ in range(8):
            body = {"model": "scripted", "messages": messages, "tools": hark.TOOLS}
            reply = (await http.post(URL, json=body)).json()
            message = reply["choices"][0]["message"]
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                result = await hark.call_tool(event, call["function"]["name"], call["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
    await llm.finish(message.get("content") or "")
