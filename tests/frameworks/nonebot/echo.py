"""The bot's own handler: it answers every message that reaches it."""

from nonebot import on_message
from nonebot.adapters.onebot.v11 import MessageEvent

echo = on_message(priority=10)


@echo.handle()
async def _(event: MessageEvent) -> None:
    await echo.finish(f"echo: {event.get_plaintext()}")
