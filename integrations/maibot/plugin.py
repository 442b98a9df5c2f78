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
"""

import asyncio
import collections
from typing import Any, ClassVar, Optional

import aiohttp

from maibot_sdk import Field, HookHandler, MaiBotPlugin, PluginConfigBase
from maibot_sdk.types import HookMode, HookOrder

# Ids of hark's messages sent lately: one handed out again is acknowledged, not sent twice.
SENT_KEPT = 2048


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
        if body.get("taken") is True:
            return {"action": "abort"}
        return {"action": "continue"}

    def normalise(self, message: dict) -> Optional[dict]:
        """The message as hark's HTTP adapter reads it; None for one hark has no use for."""
        info = message.get("message_info") or {}
        user = info.get("user_info") or {}
        group = info.get("group_info") or {}
        sender = str(user.get("user_id") or "")
        account = str(message.get("account_id") or "")
        platform = str(message.get("platform") or "")
        if not sender or not account or not platform or message.get("is_notify"):
            return None
        text = []
        quoted_id = quoted_text = quoted_sender = ""
        mentions: "list[str]" = []
        mentions_bot = False
        for part in message.get("raw_message") or []:
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
                if message["id"] in self.sent:
                    await self.acknowledge(name, account, message)
                    continue
                if not await self.send(platform, account, message):
                    continue  # not acknowledged: hark hands it out again
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
            raise ValueError(f"hark's stream {stream!r} is neither group:<id> nor private:<id>")
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

    async def send(self, platform: str, account: str, message: dict) -> bool:
        """Sends one of hark's messages; False when it could not be sent (tried for a while)."""
        for attempt in range(10):
            try:
                stream_id = await self.stream_id(platform, account, message["stream"])
                result = await self.ctx.send.text(message["text"], stream_id, storage_message=True)
                sent = result.get("sent") if isinstance(result, dict) else bool(result)
                if sent:
                    return True
                raise RuntimeError(f"MaiBot did not send it: {result!r}")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.ctx.logger.info(f"cannot send hark's message {message['id']} yet: {e!r}")
                await asyncio.sleep(min(0.2 * (attempt + 1), 1.0))
        return False

    async def acknowledge(self, name: str, account: str, message: dict) -> None:
        try:
            async with self.session().post(
                f"{self.url()}/api/v1/outbound/ack",
                json={"platform": name, "bot_id": account, "acks": [{"ack": message["ack"]}]},
            ) as response:
                if response.status != 200:
                    self.ctx.logger.warning(f"hark refused an acknowledgement: {await response.text()}")
        except Exception as e:
            self.ctx.logger.warning(f"cannot acknowledge hark's message {message['id']}: {e!r}")


def create_plugin() -> HarkPlugin:
    return HarkPlugin()
