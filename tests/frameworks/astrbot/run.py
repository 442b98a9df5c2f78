"""AstrBot as its users run it, without its web dashboard: its aiocqhttp platform (the OneBot v11
reverse WebSocket a QQ bot dials) on PORT, astrbot_plugin_hark from integrations/astrbot and an
echo plugin of the bot's own, loaded from data/plugins as AstrBot loads plugins.

ASTRBOT_ROOT is a fresh directory; HARK_* are passed to the plugin as its configuration. With
ASTRBOT_LLM_URL, AstrBot's own LLM is an OpenAI-compatible server there, and it is the bot's
handler instead of the echo plugin."""

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
root = Path(os.environ["ASTRBOT_ROOT"])
plugins = root / "data" / "plugins"
plugins.mkdir(parents=True, exist_ok=True)
(root / ".astrbot").touch()
llm_url = os.environ.get("ASTRBOT_LLM_URL", "")
installed = [("astrbot_plugin_hark", here.parents[2] / "integrations" / "astrbot")]
if not llm_url:
    installed.append(("astrbot_plugin_echo", here / "echo"))
for name, source in installed:
    target = plugins / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
settings = {
    "dashboard": {"enable": False},
}
if llm_url:
    settings["provider"] = [
        {
            "id": "scripted",
            "type": "openai_chat_completion",
            "provider_type": "chat_completion",
            "enable": True,
            "key": ["unused"],
            "api_base": llm_url,
            "model": "scripted",
            "modalities": ["text", "tool_use"],
            "timeout": 120,
        }
    ]
    settings["provider_settings"] = {
        "enable": True,
        "default_provider_id": "scripted",
        "streaming_response": False,
        "tool_call_timeout": 120,
    }
(root / "data" / "cmd_config.json").write_text(
    json.dumps(
        {
            **settings,
            "wake_prefix": ["/"],
            "platform": [
                {
                    "id": "qq",
                    "type": "aiocqhttp",
                    "enable": True,
                    "ws_reverse_host": "127.0.0.1",
                    "ws_reverse_port": int(os.environ["PORT"]),
                    "ws_reverse_token": "",
                }
            ],
        }
    )
)
config_dir = root / "data" / "config"
config_dir.mkdir(parents=True, exist_ok=True)
(config_dir / "astrbot_plugin_hark_config.json").write_text(
    json.dumps(
        {
            "hark_url": os.environ["HARK_URL"],
            "hark_token": os.environ.get("HARK_TOKEN", ""),
            "wait_ms": int(os.environ.get("HARK_WAIT_MS", "3000")),
            "pull_ms": int(os.environ.get("HARK_PULL_MS", "20000")),
            "mcp_url": os.environ.get("HARK_MCP_URL", ""),
            "mcp_token": os.environ.get("HARK_MCP_TOKEN", ""),
            "ask_wait_s": float(os.environ.get("HARK_ASK_WAIT_S", "50")),
        }
    )
)
os.chdir(root)
sys.path.insert(0, str(root))


async def main() -> None:
    from astrbot.core import LogBroker, LogManager, db_helper, logger
    from astrbot.core.initial_loader import InitialLoader

    broker = LogBroker()
    LogManager.set_queue_handler(logger, broker)
    await InitialLoader(db_helper, broker).start()


asyncio.run(main())
