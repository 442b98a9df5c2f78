"""hark for MaiBot: hark's durable questions in a MaiBot bot.

Every message is first shown to hark, from the `chat.receive.after_process` hook (blocking,
early), where MaiBot has already read what a quote quotes. When hark takes it (an answer to
one of its open questions, a `/task` command, or a hint hark replied with), the hook aborts, so
neither MaiBot's commands nor its chat loop answer it too; every other message goes on
untouched. What hark says is pulled from hark per bot account and sent through MaiBot's
`send.text`; hark keeps each message until the plugin acknowledged it, so a restart of MaiBot
or of its plugin runner loses none, and one already sent is dropped by its id.

hark knows a MaiBot account as the platform `maibot-<platform>` (e.g. `maibot-qq`) and the bot
`<account id>`: list `maibot-qq` in hark's `gateway.http.platforms` and `maibot-qq:<account>`
in `gateway.http.bots`.

With `[hark] mcp_url` and `mcp_token` set, MaiBot's own LLM (its planner) gets three tools:
`ask_user` and `approve` ask the person it is talking with, in the chat it is talking in, through
hark's MCP server, and wait for the answer; `get_answer` waits again for a question still open.
The question is hark's: it outlives the tool call, MaiBot's restart and hark's, and only that
person's reply answers it, which the hook above keeps from MaiBot's chat loop.
"""

import asyncio
import collections
import hashlib
import json
from typing import Any, ClassVar, Optional

import aiohttp

from maibot_sdk import Field, HookHandler, MaiBotPlugin, PluginConfigBase, Tool
from maibot_sdk.types import HookMode, HookOrder

# Ids of hark's messages sent lately: one handed out again is acknowledged, not sent twice.
SENT_KEPT = 2048


class CannotSend(Exception):
    """A message of hark's that can never be sent here: its stream is not a chat of MaiBot's."""


def hark_platform(platform: str) -> str:
    """The platform id hark knows a MaiBot platform by."""
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in platform.lower())
    return f"maibot-{name}"


class PluginSection(PluginConfigBase):
    __ui_label__: ClassVar[str] = "插件 Plugin"
    config_version: str = Field(default="1.0.0", description="配置版本 / config version")
    enabled: bool = Field(default=True, description="是否启用 / enabled")


class HarkSection(PluginConfigBase):
    __ui_label__: ClassVar[str] = "hark"
    url: str = Field(
        default="http://127.0.0.1:8080",
        description="hark 网关的 HTTP 地址 / where hark's gateway serves HTTP",
    )
    token: str = Field(
        default="",
        description="hark 的 gateway.http.token / hark's gateway.http.token",
    )
    wait_ms: int = Field(
        default=3000,
        description="等 hark 判定一条消息的最长毫秒数 / how long to wait for hark's verdict on a message",
    )
    pull_ms: int = Field(
        default=20000,
        description="每次向 hark 拉取消息的最长等待毫秒数 / how long one pull of hark's messages waits",
    )
    mcp_url: str = Field(
        default="",
        description=(
            "hark 的 MCP 服务地址，填了麦麦的 LLM 就有 ask_user 等工具 / hark's MCP server "
            "(http://<control.http_listen>/mcp); set, MaiBot's LLM gets ask_user, approve, get_answer"
        ),
    )
    mcp_token: str = Field(
        default="",
        description="hark 的 control.api_tokens 之一 / one of hark's control.api_tokens",
    )
    ask_wait_s: float = Field(
        default=50.0,
        description="工具等回答的最长秒数（小于 60）/ how long a tool waits for the answer (under 60)",
    )
    bots: list[str] = Field(
        default_factory=list,
        description=(
            "要投递 hark 消息的账号，格式 platform:account；留空取 MaiBot 的 bot 配置 / "
            "the accounts hark's messages go out through, as platform:account; "
            "empty takes MaiBot's [bot] settings"
        ),
    )


class HarkConfig(PluginConfigBase):
    plugin: PluginSection = Field(default_factory=PluginSection, description="插件 / plugin")
    hark: HarkSection = Field(default_factory=HarkSection, description="hark")


class HarkPlugin(MaiBotPlugin):
    config_model = HarkConfig

    def __init__(self) -> None:
        super().__init__()
        self.http: Optional[aiohttp.ClientSession] = None
        self.pollers: "dict[tuple[str, str], asyncio.Task]" = {}
        self.sent: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        # (platform, account, hark stream) -> MaiBot's session of that chat.
        self.sessions: "dict[tuple[str, str, str], str]" = {}
        # platform -> the account a message stands for when its adapter named none, as MaiBot's
        # own [bot] settings are its fallback for such an adapter (Napcat's does not name one).
        self.fallback: "dict[str, str]" = {}

    def settings(self) -> HarkSection:
        return self.config.hark

    def session(self) -> aiohttp.ClientSession:
        if self.http is None or self.http.closed:
            headers = {"Content-Type": "application/json"}
            if self.settings().token:
                headers["Authorization"] = f"Bearer {self.settings().token}"
            self.http = aiohttp.ClientSession(headers=headers)
        return self.http

    def url(self) -> str:
        return self.settings().url.rstrip("/")

    async def on_load(self) -> None:
        for platform, account in await self.accounts():
            self.fallback.setdefault(platform, account)
            self.start_delivery(platform, account)

    async def on_unload(self) -> None:
        for task in self.pollers.values():
            task.cancel()
        self.pollers.clear()
        if self.http is not None:
            await self.http.close()
            self.http = None

    async def on_config_update(self, scope: str, config_data: dict, version: str) -> None:
        # A changed hark address or token takes effect with fresh connections.
        await self.on_unload()
        await self.on_load()

    async def accounts(self) -> "list[tuple[str, str]]":
        """The accounts whose messages hark may send: the configured ones, else MaiBot's own."""
        configured = [b.partition(":") for b in self.settings().bots if ":" in b]
        if configured:
            return [(p.strip(), a.strip()) for p, _, a in configured]
        found = []
        platform = str(await self.ctx.config.get("bot.platform", "") or "")
        account = str(await self.ctx.config.get("bot.qq_account", "") or "")
        if platform and account:
            found.append((platform, account))
        for entry in await self.ctx.config.get("bot.platforms", []) or []:
            other, _, other_account = str(entry).partition(":")
            if other and other_account:
                found.append((other.strip(), other_account.strip()))
        if not found:
            self.ctx.logger.warning(
                "hark: no account to deliver hark's messages through; set [hark] bots in the "
                "plugin's config.toml, or bot.platform and bot.qq_account in MaiBot's bot_config.toml"
            )
        return found

    def start_delivery(self, platform: str, account: str) -> None:
        key = (platform, account)
        if key not in self.pollers or self.pollers[key].done():
            self.pollers[key] = asyncio.create_task(self.deliver(platform, account))

    # Inbound: every message is hark's first.

    @HookHandler(
        "chat.receive.after_process",
        name="hark_first",
        description="Shows every message to hark first; stops the message when hark took it.",
        mode=HookMode.BLOCKING,
        order=HookOrder.EARLY,
    )
    async def hark_first(self, message: Optional[dict] = None, **kwargs: Any) -> dict:
        if not isinstance(message, dict):
            return {"action": "continue"}
        normal = self.normalise(message)
        if normal is None:
            return {"action": "continue"}
        wait_ms = self.settings().wait_ms
        try:
            async with self.session().post(
                f"{self.url()}/api/v1/messages",
                params={"wait_ms": str(wait_ms)},
                json=normal,
                timeout=aiohttp.ClientTimeout(total=wait_ms / 1000 + 10),
            ) as response:
                body = await response.json(content_type=None)
                if response.status not in (200, 202):
                    self.ctx.logger.warning(f"hark refused a message ({response.status}): {body}")
                    return {"action": "continue"}
        except Exception as e:
            self.ctx.logger.warning(f"hark does not answer at {self.url()}; the message goes on: {e!r}")
            return {"action": "continue"}
        if isinstance(body, dict) and body.get("taken") is True:
            return {"action": "abort"}
        return {"action": "continue"}

    def normalise(self, message: dict) -> Optional[dict]:
        """The message as hark's HTTP adapter reads it; None for one hark has no use for."""
        info = message.get("message_info") or {}
        user = info.get("user_info") or {}
        group = info.get("group_info") or {}
        sender = str(user.get("user_id") or "")
        platform = str(message.get("platform") or "")
        account = str(message.get("account_id") or self.fallback.get(platform, ""))
        if not sender or not account or not platform or message.get("is_notify"):
            return None
        if sender == account:
            return None  # the bot's own message, as an adapter may report it back
        text = []
        quoted_id = quoted_text = quoted_sender = ""
        mentions: "list[str]" = []
        mentions_bot = False
        for part in message.get("raw_message") or []:
            if not isinstance(part, dict):
                continue
            kind, data = part.get("type"), part.get("data")
            if kind == "text" and isinstance(data, str):
                text.append(data)
            elif kind == "reply" and isinstance(data, dict):
                quoted_id = str(data.get("target_message_id") or "")
                quoted_text = str(data.get("target_message_content") or "")
                quoted_sender = str(data.get("target_message_sender_id") or "")
            elif kind == "at" and isinstance(data, dict):
                target = str(data.get("target_user_id") or "")
                if target == account:
                    mentions_bot = True
                elif target and target != "all":
                    mentions.append(target)
        group_id = str(group.get("group_id") or "")
        return {
            "platform": hark_platform(platform),
            "bot_id": account,
            "stream": f"group:{group_id}" if group_id else f"private:{sender}",
            "sender": {
                "user_id": sender,
                "nickname": str(user.get("user_cardname") or user.get("user_nickname") or ""),
            },
            "text": "".join(text).strip(),
            "message_id": str(message.get("message_id") or ""),
            "quoted_message_id": quoted_id,
            "quoted_text": quoted_text,
            "quoted_sender": quoted_sender,
            "mentions": mentions,
            "mentions_bot": mentions_bot,
        }

    # Outbound: hark's messages, pulled per account and acknowledged once sent.

    async def deliver(self, platform: str, account: str) -> None:
        name = hark_platform(platform)
        pull_ms = self.settings().pull_ms
        pause = 1.0
        while True:
            try:
                async with self.session().get(
                    f"{self.url()}/api/v1/outbound",
                    params={"platform": name, "bot_id": account, "wait_ms": str(pull_ms)},
                    timeout=aiohttp.ClientTimeout(total=pull_ms / 1000 + 10),
                ) as response:
                    body = await response.json(content_type=None)
                    if response.status == 404:
                        self.ctx.logger.info(
                            f"hark delivers nothing to {name}:{account} (not in its gateway.http.bots)"
                        )
                        return
                    if response.status != 200:
                        raise RuntimeError(f"{response.status}: {body}")
                pause = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.ctx.logger.warning(f"cannot pull hark's messages for {name}:{account} (retrying): {e!r}")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30.0)
                continue
            for message in body.get("messages", []):
                try:
                    await self.deliver_one(platform, name, account, message)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    # One message hark's API gave in a shape not understood stops no other.
                    self.ctx.logger.warning(f"cannot deliver hark's message {message!r:.200}: {e!r}")
                    await self.acknowledge(name, account, message, failed=repr(e), retry=False)

    async def deliver_one(self, platform: str, name: str, account: str, message: dict) -> None:
        if message["id"] in self.sent:
            await self.acknowledge(name, account, message)
            return
        try:
            await self.send(platform, account, message)
        except CannotSend as e:
            self.ctx.logger.warning(f"hark's message {message['id']} can never be sent here: {e}")
            await self.acknowledge(name, account, message, failed=str(e), retry=False)
            return
        except Exception as e:
            # hark hands it out again after a while, and sets it aside after a few times.
            await self.acknowledge(name, account, message, failed=repr(e))
            return
        self.sent[message["id"]] = None
        while len(self.sent) > SENT_KEPT:
            self.sent.popitem(last=False)
        await self.acknowledge(name, account, message)

    async def stream_id(self, platform: str, account: str, stream: str) -> str:
        """MaiBot's session of one of hark's streams (`group:<id>` or `private:<id>`), opened
        when MaiBot has none yet: a chat whose every message hark took, or one hark asks in first."""
        key = (platform, account, stream)
        if key in self.sessions:
            return self.sessions[key]
        kind, _, target = stream.partition(":")
        if kind not in ("group", "private") or not target:
            raise CannotSend(f"hark's stream {stream!r} is neither group:<id> nor private:<id>")
        opened = await self.ctx.chat.open_session(
            platform=platform,
            chat_type=kind,
            group_id=target if kind == "group" else "",
            user_id=target if kind == "private" else "",
            account_id=account,
        )
        session = opened.get("session_id") if isinstance(opened, dict) else None
        if not session:
            raise LookupError(f"MaiBot opened no chat for {stream} on {platform}:{account}: {opened!r}")
        self.sessions[key] = str(session)
        return str(session)

    async def send(self, platform: str, account: str, message: dict) -> None:
        """Sends one of hark's messages. Raises CannotSend for one that can never be sent here,
        and the last error when it could not be sent now (tried for a moment)."""
        for attempt in range(3):
            try:
                stream_id = await self.stream_id(platform, account, message["stream"])
                result = await self.ctx.send.text(message["text"], stream_id, storage_message=True)
                sent = result.get("sent") if isinstance(result, dict) else bool(result)
                if sent:
                    return
                raise RuntimeError(f"MaiBot did not send it: {result!r}")
            except (asyncio.CancelledError, CannotSend):
                raise
            except Exception as e:
                self.ctx.logger.info(f"cannot send hark's message {message['id']} yet: {e!r}")
                if attempt == 2:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))

    async def acknowledge(
        self, name: str, account: str, message: dict, failed: Optional[str] = None, retry: bool = True
    ) -> None:
        """Tells hark a message was sent, or with `failed`, why not: hark then hands it out again
        later (`retry`), or sets it aside."""
        if not isinstance(message, dict) or "ack" not in message:
            return
        entry: dict = {"ack": message["ack"]}
        if failed is not None:
            entry["failed"] = failed[:500]
            entry["retry"] = retry
        try:
            async with self.session().post(
                f"{self.url()}/api/v1/outbound/ack",
                json={"platform": name, "bot_id": account, "acks": [entry]},
            ) as response:
                if response.status != 200:
                    self.ctx.logger.warning(f"hark refused an acknowledgement: {await response.text()}")
        except Exception as e:
            self.ctx.logger.warning(f"cannot acknowledge hark's message {message.get('id')}: {e!r}")


    # MaiBot's LLM asks through hark's MCP server.

    @Tool(
        "ask_user",
        description=(
            "Ask the person you are talking with a question in this chat, and wait for their "
            "answer. The question stays open until they answer, however long that takes and "
            "across restarts; only they can answer it. If the result says the question is still "
            "open, call get_answer with its question_id later instead of asking again."
        ),
        parameters={
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
        visibility="visible",
    )
    async def ask_user(self, question: str = "", choices: Optional[list] = None, **context: Any) -> dict:
        arguments: dict = {"question": question}
        if choices:
            arguments["choices"] = [str(c) for c in choices]
        return {"content": await self.ask("ask_user", arguments, context)}

    @Tool(
        "approve",
        description=(
            "Ask the person you are talking with to approve an action before you take it, and "
            "wait for their decision. Returns whether it was approved, and their reason."
        ),
        parameters={
            "type": "object",
            "properties": {
                "action": {"type": "string", "description": "What you are about to do, as the person will read it."},
                "details": {"type": "string", "description": "What they should know to decide."},
            },
            "required": ["action"],
        },
        visibility="visible",
    )
    async def approve(self, action: str = "", details: str = "", **context: Any) -> dict:
        arguments: dict = {"action": action}
        if details:
            arguments["details"] = details
        return {"content": await self.ask("approve", arguments, context)}

    @Tool(
        "get_answer",
        description="Wait again for the answer to a question asked before with ask_user or approve.",
        parameters={
            "type": "object",
            "properties": {
                "question_id": {"type": "string", "description": "The question_id the earlier call returned."},
            },
            "required": ["question_id"],
        },
        visibility="visible",
    )
    async def get_answer(self, question_id: str = "", **context: Any) -> dict:
        return {"content": await self.wait_for(question_id, None)}

    async def ask(self, tool: str, arguments: dict, context: dict) -> str:
        settings = self.settings()
        if not settings.mcp_url:
            return "hark's MCP server is not configured ([hark] mcp_url in the hark plugin's config.toml); nobody was asked."
        platform = str(context.get("platform") or "")
        person = str(context.get("user_id") or "")
        group = str(context.get("group_id") or "")
        if not platform or not person:
            return "Could not ask through hark: MaiBot did not say who you are talking with."
        arguments["owner"] = f"{hark_platform(platform)}:{person}"
        if group:
            arguments["chat"] = f"group:{group}"
        # The same call made again (MaiBot retried it) is the same question, not a second one.
        asked = json.dumps(arguments, sort_keys=True, ensure_ascii=False).encode()
        arguments["request_id"] = (
            f"maibot:{context.get('stream_id', '')}:{tool}:" + hashlib.sha256(asked).hexdigest()[:16]
        )
        deadline = asyncio.get_running_loop().time() + settings.ask_wait_s
        try:
            result = await self.call_mcp(tool, arguments)
        except Exception as e:
            self.ctx.logger.warning(f"hark's MCP server at {settings.mcp_url} failed: {e!r}")
            return f"Could not ask through hark: {e}"
        if result.get("status") == "waiting":
            return await self.wait_for(result["question_id"], deadline)
        return self.read(result)

    async def wait_for(self, question_id: str, deadline: Optional[float]) -> str:
        settings = self.settings()
        if not settings.mcp_url:
            return "hark's MCP server is not configured ([hark] mcp_url in the hark plugin's config.toml)."
        loop = asyncio.get_running_loop()
        deadline = deadline if deadline is not None else loop.time() + settings.ask_wait_s
        result: dict = {"status": "waiting", "question_id": question_id}
        while result.get("status") == "waiting":
            left = deadline - loop.time()
            if left < 1:
                return (
                    f"No answer yet; the question stays open in the chat. Call get_answer with "
                    f'question_id "{question_id}" later; do not ask again.'
                )
            try:
                result = await self.call_mcp("get_answer", {"question_id": question_id, "wait_s": int(left)})
            except Exception as e:
                self.ctx.logger.warning(f"hark's MCP server at {settings.mcp_url} failed: {e!r}")
                return f'Could not reach hark: {e}. Call get_answer with question_id "{question_id}" later.'
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
            verdict = "approved" if str(answer["decision"]).startswith("approve") else "not approved"
            reason = answer.get("reason")
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

        settings = self.settings()
        headers = {"Authorization": f"Bearer {settings.mcp_token}"} if settings.mcp_token else {}
        # hark holds a call for up to its mcp.hold before it says "waiting".
        async with streamablehttp_client(settings.mcp_url, headers=headers, timeout=settings.ask_wait_s + 30) as (
            read,
            write,
            _,
        ):
            async with ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool(tool, arguments)
        text = "".join(getattr(part, "text", "") for part in result.content)
        if result.isError:
            raise RuntimeError(text or "the tool failed")
        out = dict(result.structuredContent or {})
        out["text"] = text
        return out


def create_plugin() -> HarkPlugin:
    return HarkPlugin()
