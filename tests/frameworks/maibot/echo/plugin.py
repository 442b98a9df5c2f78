"""The test bot's own handler: it answers every message that reaches it, and ends it there."""

from typing import Any, Optional

from maibot_sdk import HookHandler, MaiBotPlugin
from maibot_sdk.types import HookMode, HookOrder


class Echo(MaiBotPlugin):
    async def on_load(self) -> None:
        pass

    async def on_unload(self) -> None:
        pass

    async def on_config_update(self, scope: str, config_data: dict, version: str) -> None:
        pass

    @HookHandler("chat.receive.after_process", mode=HookMode.BLOCKING, order=HookOrder.NORMAL)
    async def echo(self, message: Optional[dict] = None, **kwargs: Any) -> dict:
        text = "".join(
            part["data"]
            for part in (message or {}).get("raw_message") or []
            if part.get("type") == "text" and isinstance(part.get("data"), str)
        ).strip()
        # Before MaiBot registers a chat's first message, only an opened session can be sent to.
        info = message["message_info"]
        group = (info.get("group_info") or {}).get("group_id") or ""
        opened = await self.ctx.chat.open_session(
            platform=message["platform"],
            chat_type="group" if group else "private",
            group_id=group,
            user_id="" if group else info["user_info"]["user_id"],
            account_id=message.get("account_id") or "",
        )
        await self.ctx.send.text(f"echo: {text}", opened["session_id"])
        return {"action": "abort"}


def create_plugin() -> Echo:
    return Echo()
