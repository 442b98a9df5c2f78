"""A NoneBot2 bot as its users run one: the FastAPI driver, the OneBot v11 adapter (its reverse
WebSocket at /onebot/v11/ws), nonebot-plugin-hark from integrations/nonebot, and an ordinary
handler of the bot's own that echoes every message it gets (or, with NONEBOT_LLM_URL, answers it
with an LLM that has hark's tools)."""

import os
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[2] / "integrations" / "nonebot"))
sys.path.insert(0, str(here))

import nonebot  # noqa: E402
from nonebot.adapters.onebot.v11 import Adapter  # noqa: E402

nonebot.init(driver="~fastapi", host="127.0.0.1", port=int(os.environ["PORT"]))
nonebot.get_driver().register_adapter(Adapter)
nonebot.load_plugin("nonebot_plugin_hark")
# With NONEBOT_LLM_URL, the bot's handler is an LLM with hark's tools instead of the echo.
nonebot.load_plugin("llm" if os.environ.get("NONEBOT_LLM_URL") else "echo")

if __name__ == "__main__":
    nonebot.run()
