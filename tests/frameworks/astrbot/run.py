"""AstrBot as its users run it, without its web dashboard: its aiocqhttp platform (the OneBot v11
reverse WebSocket a QQ bot dials) on PORT, astrbot_plugin_hark from integrations/astrbot and an
echo plugin of the bot's own, loaded from data/plugins as AstrBot loads plugins.

ASTRBOT_ROOT is a fresh directory; HARK_* are passed to the plugin as its configuration."""

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
for name, source in [
    ("astrbot_plugin_hark", here.parents[2] / "integrations" / "astrbot"),
    ("astrbot_plugin_echo", here / "echo"),
]:
    target = plugins / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
(root / "data" / "cmd_config.json").write_text(
    json.dumps(
        {
            "dashboard": {"enable": False},
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
