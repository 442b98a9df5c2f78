"""nonebot-plugin-hark: hark's durable questions in a NoneBot2 bot.

Every message the bot receives is first shown to hark. When hark takes it (an answer to one of
its open questions, a `/task` command, or a hint hark replied with), this plugin's matcher
blocks it, so that no other handler also answers it. Every other message reaches the bot's
handlers untouched. What hark says (its questions, its replies) is pulled from hark and sent
through the bot's own send API; hark keeps each message until the plugin acknowledged it, so a
restart loses none, and one already sent is dropped by its id.

An LLM the bot runs can ask through hark too: offer it `TOOLS` and run its calls with
`call_tool(event, name, arguments)` (see `tools.py`).
"""

import asyncio
import collections
from typing import Optional

from nonebot import get_driver, get_plugin_config, logger, on_message
from nonebot.adapters.onebot.v11 import (
    Bot,
    GroupMessageEvent,
    Message,
    MessageEvent,
    MessageSegment,
)
from nonebot.plugin import PluginMetadata
from nonebot.rule import Rule
from nonebot.typing import T_State

from .client import Hark, HarkError
from .config import Config
from .tools import TOOLS, Tools

__plugin_meta__ = PluginMetadata(
    name="hark",
    description="Durable questions: an AI task asks in the chat and waits, across restarts, for its owner's answer",
    usage="Send `/task help` in a chat. Answers to hark's questions are taken by hark; everything else reaches your handlers.",
    type="application",
    config=Config,
    supported_adapters={"~onebot.v11"},
)

config = get_plugin_config(Config)
hark = Hark(config.hark_url, config.hark_token, config.hark_platform)
tools = Tools(config.hark_mcp_url, config.hark_mcp_token, config.hark_platform, config.hark_ask_wait_s)
driver = get_driver()

__all__ = ["TOOLS", "approve", "ask_user", "call_tool"]


async def call_tool(event: MessageEvent, name: str, arguments) -> str:
    """Runs an LLM's call of one of `TOOLS` for the person who sent `event`; what it reads back."""
    return await tools.call_tool(event, name, arguments)


async def ask_user(event: MessageEvent, question: str, choices: Optional[list] = None) -> str:
    """Asks the person who sent `event`, in that chat, and waits for the answer."""
    return await tools.ask_user(event, question, choices)


async def approve(event: MessageEvent, action: str, details: str = "") -> str:
    """Asks the person who sent `event` to approve `action`, and waits for the decision."""
    return await tools.approve(event, action, details)

# Ids of hark's messages sent lately: one handed out again (its acknowledgement was lost) is
# acknowledged and not sent twice.
_sent: "collections.OrderedDict[str, None]" = collections.OrderedDict()
_SENT_KEPT = 2048
_pollers: "dict[str, asyncio.Task]" = {}


def _stream(event: MessageEvent) -> str:
    if isinstance(event, GroupMessageEvent):
        return f"group:{event.group_id}"
    return f"private:{event.user_id}"


def _quoted(event: MessageEvent) -> "tuple[str, str, str]":
    """The id, text and author of the message `event` quotes, or empty strings."""
    if event.reply is not None:
        return (
            str(event.reply.message_id),
            event.reply.message.extract_plain_text(),
            str(event.reply.sender.user_id or ""),
        )
    for segment in event.original_message:
        if segment.type == "reply":
            return (str(segment.data.get("id", "")), "", "")
    return ("", "", "")


def _normalise(bot: Bot, event: MessageEvent) -> dict:
    quoted_id, quoted_text, quoted_sender = _quoted(event)
    mentions = [
        str(segment.data.get("qq"))
        for segment in event.original_message
        if segment.type == "at" and str(segment.data.get("qq")) not in (bot.self_id, "all")
    ]
    return {
        "bot_id": bot.self_id,
        "stream": _stream(event),
        "sender": {
            "user_id": str(event.user_id),
            "nickname": event.sender.card or event.sender.nickname or "",
        },
        "text": event.get_plaintext(),
        "message_id": str(event.message_id),
        "quoted_message_id": quoted_id,
        "quoted_text": quoted_text,
        "quoted_sender": quoted_sender,
        "mentions": mentions,
        "mentions_bot": isinstance(event, GroupMessageEvent) and event.to_me,
    }


async def _taken_by_hark(bot: Bot, event: MessageEvent, state: T_State) -> bool:
    """Shows the message to hark; true when hark took it."""
    try:
        verdict = await hark.post(_normalise(bot, event), config.hark_wait_ms)
    except HarkError as e:
        logger.warning(f"hark did not take message {event.message_id}: {e}")
        return False
    state["hark"] = verdict
    return verdict.get("taken") is True


# Priority 1 and blocking: a message hark took goes no further. Give your own handlers a
# priority of 2 or more.
taken = on_message(rule=Rule(_taken_by_hark), priority=1, block=True)


@taken.handle()
async def _taken(state: T_State) -> None:
    logger.debug(f"hark took a message as {state['hark'].get('as')}")


class CannotSend(Exception):
    """A message of hark's that this bot can never send: its chat is not a QQ chat."""


async def _send(bot: Bot, message: dict) -> Optional[int]:
    """Sends one of hark's messages through the bot; the platform's id of it."""
    kind, _, target = message["stream"].partition(":")
    if kind not in ("group", "private") or not target.lstrip("-").isdigit():
        raise CannotSend(f"{message['stream']!r} is not a chat this bot can reach")
    # As text: what hark says (a task's goal, an answer) is never read as CQ codes.
    body = Message(MessageSegment.text(message["text"]))
    reply_to = message.get("reply_to_message_id") or ""
    if reply_to.lstrip("-").isdigit():
        body = MessageSegment.reply(int(reply_to)) + body
    if kind == "group":
        result = await bot.send_group_msg(group_id=int(target), message=body)
    else:
        result = await bot.send_private_msg(user_id=int(target), message=body)
    return (result or {}).get("message_id")


async def _deliver(bot: Bot) -> None:
    """Sends hark's messages for `bot` until it disconnects."""
    pause = 1.0
    while True:
        try:
            messages = await hark.pull(bot.self_id, config.hark_pull_ms)
            pause = 1.0
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.warning(f"cannot pull hark's messages for bot {bot.self_id} (retrying): {e!r}")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 30.0)
            continue
        for message in messages:
            try:
                await _deliver_one(bot, message)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # One message in a shape not understood stops none of the others.
                logger.warning(f"cannot send hark's message {message!r:.200}: {e!r}")
                await _acknowledge(bot, message, failed=repr(e), retry=False)


async def _deliver_one(bot: Bot, message: dict) -> None:
    if message["id"] in _sent:
        await _acknowledge(bot, message)
        return
    try:
        message_id = await _send(bot, message)
    except CannotSend as e:
        logger.warning(f"hark's message {message['id']} can never be sent here: {e}")
        await _acknowledge(bot, message, failed=str(e), retry=False)
        return
    except Exception as e:
        # hark hands it out again after a while, and sets it aside after a few times.
        logger.warning(f"cannot send hark's message {message['id']}: {e!r}")
        await _acknowledge(bot, message, failed=repr(e))
        return
    _sent[message["id"]] = None
    while len(_sent) > _SENT_KEPT:
        _sent.popitem(last=False)
    await _acknowledge(bot, message, message_id)


async def _acknowledge(
    bot: Bot,
    message: dict,
    message_id: Optional[int] = None,
    failed: Optional[str] = None,
    retry: bool = True,
) -> None:
    """Tells hark the message was sent, or with `failed`, why not: hark then hands it out again
    later (`retry`), or sets it aside."""
    if not isinstance(message, dict) or "ack" not in message:
        return
    try:
        await hark.ack(bot.self_id, message["ack"], message_id, failed, retry)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        logger.warning(f"cannot acknowledge hark's message {message.get('id')}: {e!r}")


@driver.on_bot_connect
async def _connected(bot: Bot) -> None:
    old = _pollers.pop(bot.self_id, None)
    if old is not None:
        old.cancel()
    _pollers[bot.self_id] = asyncio.create_task(_deliver(bot))


@driver.on_bot_disconnect
async def _disconnected(bot: Bot) -> None:
    poller = _pollers.pop(bot.self_id, None)
    if poller is not None:
        poller.cancel()


@driver.on_shutdown
async def _shutdown() -> None:
    for poller in _pollers.values():
        poller.cancel()
    _pollers.clear()
    await hark.close()
    await tools.close()
