"""astrbot_plugin_hark: hark's durable questions in an AstrBot bot.

Every message is first shown to hark. When hark takes it (an answer to one of its open
questions, a `/task` command, or a hint hark replied with), `event.stop_event()` keeps every
other plugin and the bot's LLM from also answering it; every other message goes on untouched.
What hark says is pulled from hark per platform instance and sent through the platform; hark
keeps each message until the plugin acknowledged it, so a restart loses none, and one already
sent is dropped by its id.

hark knows an AstrBot platform instance as the platform `astrbot-<adapter>` (e.g.
`astrbot-aiocqhttp`) and the bot `<instance id>`: list `astrbot-aiocqhttp` in hark's
`gateway.http.platforms` and `astrbot-aiocqhttp:<instance id>` in `gateway.http.bots`.

With `mcp_url` and `mcp_token` set, AstrBot's own LLM gets three tools: `ask_user` and `approve`
ask the person it is talking with, in the chat it is talking in, through hark's MCP server, and
wait for the answer; `get_answer` waits again for a question still open. The question is hark's:
it outlives the tool call, AstrBot's restart and hark's, and only that person's reply answers it.
"""

import asyncio
import collections
import hashlib
import json
from sys import maxsize
from typing import Optional

import aiohttp

import astrbot.api.message_components as Comp
from astrbot.api import AstrBotConfig, logger
from astrbot.api.event import AstrMessageEvent, MessageChain, filter
from astrbot.api.star import Context, Star

# Ids of hark's messages sent lately: one handed out again is acknowledged, not sent twice.
SENT_KEPT = 2048


class CannotSend(Exception):
    """A message of hark's that this platform can never send: its chat is not one of it."""


def hark_platform(adapter: str) -> str:
    """The platform id hark knows an AstrBot adapter by."""
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in adapter.lower())
    return f"astrbot-{name}"


class Hark(Star):
    def __init__(self, context: Context, config: AstrBotConfig):
        super().__init__(context)
        self.url = str(config.get("hark_url", "http://127.0.0.1:8080")).rstrip("/")
        self.token = str(config.get("hark_token", ""))
        self.wait_ms = int(config.get("wait_ms", 3000))
        self.pull_ms = int(config.get("pull_ms", 20000))
        self.mcp_url = str(config.get("mcp_url", "")).strip()
        self.mcp_token = str(config.get("mcp_token", ""))
        self.ask_wait_s = float(config.get("ask_wait_s", 50))
        self.http: Optional[aiohttp.ClientSession] = None
        self.pollers: "dict[str, asyncio.Task]" = {}
        self.sent: "collections.OrderedDict[str, None]" = collections.OrderedDict()

    def session(self) -> aiohttp.ClientSession:
        if self.http is None or self.http.closed:
            headers = {"Content-Type": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self.http = aiohttp.ClientSession(headers=headers)
        return self.http

    # Inbound: every message is hark's first.

    @filter.event_message_type(filter.EventMessageType.ALL, priority=maxsize - 2)
    async def to_hark(self, event: AstrMessageEvent):
        message = self.normalise(event)
        try:
            async with self.session().post(
                f"{self.url}/api/v1/messages",
                params={"wait_ms": str(self.wait_ms)},
                json=message,
                timeout=aiohttp.ClientTimeout(total=self.wait_ms / 1000 + 10),
            ) as response:
                body = await response.json(content_type=None)
                if response.status not in (200, 202):
                    logger.warning(f"hark refused a message ({response.status}): {body}")
                    return
        except Exception as e:
            logger.warning(f"hark does not answer at {self.url}; the message goes on: {e!r}")
            return
        if isinstance(body, dict) and body.get("taken") is True:
            event.stop_event()

    def normalise(self, event: AstrMessageEvent) -> dict:
        obj = event.message_obj
        self_id = str(event.get_self_id())
        group = event.get_group_id()
        sender = str(event.get_sender_id())
        quoted_id = quoted_text = quoted_sender = ""
        mentions = []
        mentions_bot = False
        for part in obj.message:
            if isinstance(part, Comp.Reply):
                quoted_id = str(part.id or "")
                quoted_text = part.message_str or ""
                quoted_sender = str(part.sender_id or "")
            elif isinstance(part, Comp.At):
                if str(part.qq) == self_id:
                    mentions_bot = True
                elif str(part.qq) != "all":
                    mentions.append(str(part.qq))
        return {
            "platform": hark_platform(event.get_platform_name()),
            "bot_id": event.get_platform_id(),
            "stream": f"group:{group}" if group else f"private:{sender}",
            "sender": {"user_id": sender, "nickname": event.get_sender_name() or ""},
            # As written: AstrBot's wake prefix is not part of the message for hark.
            "text": obj.message_str or "",
            "message_id": str(obj.message_id),
            "quoted_message_id": quoted_id,
            "quoted_text": quoted_text,
            "quoted_sender": quoted_sender,
            "mentions": mentions,
            "mentions_bot": mentions_bot,
        }

    # Outbound: hark's messages, pulled per platform instance and acknowledged once sent.

    @filter.on_astrbot_loaded()
    async def loaded(self):
        for platform in self.context.platform_manager.platform_insts:
            meta = platform.meta()
            if meta.id not in self.pollers:
                self.pollers[meta.id] = asyncio.create_task(self.deliver(platform))

    async def deliver(self, platform) -> None:
        meta = platform.meta()
        name, bot = hark_platform(meta.name), meta.id
        pause = 1.0
        while True:
            try:
                async with self.session().get(
                    f"{self.url}/api/v1/outbound",
                    params={"platform": name, "bot_id": bot, "wait_ms": str(self.pull_ms)},
                    timeout=aiohttp.ClientTimeout(total=self.pull_ms / 1000 + 10),
                ) as response:
                    body = await response.json(content_type=None)
                    if response.status == 404:
                        logger.info(
                            f"hark delivers nothing to {name}:{bot} (not in its gateway.http.bots)"
                        )
                        return
                    if response.status != 200:
                        raise RuntimeError(f"{response.status}: {body}")
                pause = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.warning(f"cannot pull hark's messages for {name}:{bot} (retrying): {e!r}")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30.0)
                continue
            for message in body.get("messages", []):
                try:
                    await self.deliver_one(platform, name, bot, message)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    # One message in a shape not understood stops none of the others.
                    logger.warning(f"cannot send hark's message {message!r:.200}: {e!r}")
                    await self.acknowledge(name, bot, message, failed=repr(e), retry=False)

    async def deliver_one(self, platform, name: str, bot: str, message: dict) -> None:
        if message["id"] in self.sent:
            await self.acknowledge(name, bot, message)
            return
        try:
            sent = await self.send(platform, message)
        except CannotSend as e:
            logger.warning(f"hark's message {message['id']} can never be sent here: {e}")
            await self.acknowledge(name, bot, message, failed=str(e), retry=False)
            return
        except Exception as e:
            # hark hands it out again after a while, and sets it aside after a few times.
            await self.acknowledge(name, bot, message, failed=repr(e))
            return
        self.sent[message["id"]] = None
        while len(self.sent) > SENT_KEPT:
            self.sent.popitem(last=False)
        await self.acknowledge(name, bot, message, message_id=sent)

    async def send(self, platform, message: dict):
        """Sends one of hark's messages; the platform's id of it, or None when it gave none.
        Raises CannotSend for a message this platform can never send, and the last error when
        it could not be sent now (the bot is not connected yet: tried for a moment)."""
        kind, _, target = message["stream"].partition(":")
        reply_to = message.get("reply_to_message_id") or ""
        text = message["text"]
        onebot = platform.meta().name == "aiocqhttp"
        if kind not in ("group", "private") or (onebot and not target.lstrip("-").isdigit()):
            raise CannotSend(f"{message['stream']!r} is not a chat of {platform.meta().name}")
        for attempt in range(3):
            try:
                if onebot:
                    # Through the OneBot connection itself: its answer names the message, so a
                    # quote of a question finds it.
                    segments = []
                    if reply_to.lstrip("-").isdigit():
                        segments.append({"type": "reply", "data": {"id": reply_to}})
                    segments.append({"type": "text", "data": {"text": text}})
                    client = platform.get_client()
                    if kind == "group":
                        result = await client.send_group_msg(group_id=int(target), message=segments)
                    else:
                        result = await client.send_private_msg(user_id=int(target), message=segments)
                    return (result or {}).get("message_id")
                message_type = "GroupMessage" if kind == "group" else "FriendMessage"
                origin = f"{platform.meta().id}:{message_type}:{target}"
                chain = MessageChain().message(text)
                await self.context.send_message(origin, chain)
                return None
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.info(f"cannot send hark's message {message['id']} yet: {e!r}")
                if attempt == 2:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))

    async def acknowledge(
        self, name: str, bot: str, message: dict, message_id=None, failed=None, retry=True
    ) -> None:
        """Tells hark a message was sent, or with `failed`, why it was not: hark then hands it
        out again later (`retry`), or sets it aside."""
        if not isinstance(message, dict) or "ack" not in message:
            return
        entry = {"ack": message["ack"]}
        if message_id is not None:
            entry["message_id"] = message_id
        if failed is not None:
            entry["failed"] = failed[:500]
            entry["retry"] = retry
        try:
            async with self.session().post(
                f"{self.url}/api/v1/outbound/ack",
                json={"platform": name, "bot_id": bot, "acks": [entry]},
            ) as response:
                if response.status != 200:
                    logger.warning(f"hark refused an acknowledgement: {await response.text()}")
        except Exception as e:
            logger.warning(f"cannot acknowledge hark's message {message.get('id')}: {e!r}")

    # AstrBot's LLM asks through hark's MCP server.

    @filter.llm_tool(name="ask_user")
    async def ask_user(self, event: AstrMessageEvent, question: str, choices: list = None):
        """Ask the person you are talking with a question in this chat, and wait for their answer.
        The question stays open until they answer, however long that takes and across restarts;
        only they can answer it. If the result says the question is still open, call get_answer
        with its question_id later instead of asking again.

        Args:
            question(string): The question, as the person will read it.
            choices(array[string]): The answers the person picks from; leave out for a free answer.
        """
        arguments = {"question": question}
        if choices:
            arguments["choices"] = [str(c) for c in choices]
        return await self.ask(event, "ask_user", arguments)

    @filter.llm_tool(name="approve")
    async def approve(self, event: AstrMessageEvent, action: str, details: str = ""):
        """Ask the person you are talking with to approve an action before you take it, and wait
        for their decision. Returns whether it was approved, and their reason.

        Args:
            action(string): What you are about to do, as the person will read it.
            details(string): What they should know to decide.
        """
        arguments = {"action": action}
        if details:
            arguments["details"] = details
        return await self.ask(event, "approve", arguments)

    @filter.llm_tool(name="get_answer")
    async def get_answer(self, event: AstrMessageEvent, question_id: str):
        """Wait again for the answer to a question asked before with ask_user or approve.

        Args:
            question_id(string): The question_id the earlier call returned.
        """
        return await self.wait_for(question_id, None)

    async def ask(self, event: AstrMessageEvent, tool: str, arguments: dict) -> str:
        if not self.mcp_url:
            return "hark's MCP server is not configured (mcp_url in the hark plugin's settings); nobody was asked."
        group = event.get_group_id()
        sender = str(event.get_sender_id())
        arguments["owner"] = f"{hark_platform(event.get_platform_name())}:{sender}"
        if group:
            arguments["chat"] = f"group:{group}"
        # The same call made again (AstrBot retried it) is the same question, not a second one.
        asked = json.dumps(arguments, sort_keys=True, ensure_ascii=False).encode()
        arguments["request_id"] = (
            f"astrbot:{event.get_platform_id()}:{event.message_obj.message_id}:{tool}:"
            + hashlib.sha256(asked).hexdigest()[:16]
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ask_wait_s
        try:
            result = await self.call_mcp(tool, arguments)
        except Exception as e:
            logger.warning(f"hark's MCP server at {self.mcp_url} failed: {e!r}")
            return f"Could not ask through hark: {e}"
        if result.get("status") == "waiting":
            return await self.wait_for(result["question_id"], deadline)
        return self.read(result)

    async def wait_for(self, question_id: str, deadline) -> str:
        if not self.mcp_url:
            return "hark's MCP server is not configured (mcp_url in the hark plugin's settings)."
        loop = asyncio.get_running_loop()
        deadline = deadline if deadline is not None else loop.time() + self.ask_wait_s
        result = {"status": "waiting", "question_id": question_id}
        while result.get("status") == "waiting":
            left = deadline - loop.time()
            if left < 1:
                return (
                    f"No answer yet; the question stays open in the chat. Call get_answer with "
                    f'question_id "{question_id}" later; do not ask again.'
                )
            try:
                result = await self.call_mcp(
                    "get_answer", {"question_id": question_id, "wait_s": int(left)}
                )
            except Exception as e:
                logger.warning(f"hark's MCP server at {self.mcp_url} failed: {e!r}")
                return f"Could not reach hark: {e}. Call get_answer with question_id \"{question_id}\" later."
        return self.read(result)

    @staticmethod
    def read(result: dict) -> str:
        """What the LLM reads of a tool's result."""
        if "approved" in result:
            verdict = "approved" if result["approved"] else "not approved"
            reason = result.get("reason")
            return f"{verdict}: {reason}" if reason else verdict
        answer = result.get("answer")
        if isinstance(answer, dict) and "decision" in answer:
            approved = str(answer["decision"]).startswith("approve")
            reason = answer.get("reason")
            verdict = "approved" if approved else "not approved"
            return f"{verdict}: {reason}" if reason else verdict
        if result.get("text"):
            return result["text"]
        if result.get("status") == "answered":
            return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        return f"The question was {result.get('status', 'closed')}; no answer will come."

    async def call_mcp(self, tool: str, arguments: dict) -> dict:
        """Calls one of hark's MCP tools; its structured result, with its text as `text`."""
        from mcp import ClientSession
        from mcp.client.streamable_http import streamablehttp_client

        headers = {"Authorization": f"Bearer {self.mcp_token}"} if self.mcp_token else {}
        # hark holds a call for up to its mcp.hold before it says "waiting".
        async with streamablehttp_client(
            self.mcp_url, headers=headers, timeout=self.ask_wait_s + 30
        ) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool(tool, arguments)
        text = "".join(getattr(part, "text", "") for part in result.content)
        if result.isError:
            raise RuntimeError(text or "the tool failed")
        out = dict(result.structuredContent or {})
        out["text"] = text
        return out

    async def terminate(self):
        for poller in self.pollers.values():
            poller.cancel()
        self.pollers.clear()
        if self.http is not None:
            await self.http.close()
