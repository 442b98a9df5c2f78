"""MaiBot as its users run it, without its web UI: `maibot run` on an instance directory made by
`maibot init`, its maim_message WebSocket (where a platform adapter such as the Napcat adapter
connects) on PORT, hark's plugin from integrations/maibot and an echo plugin of the bot's own,
loaded from the instance's plugins/ by MaiBot's plugin runner.

MAIBOT_ROOT is a fresh directory; HARK_* become the hark plugin's config.toml. The models point
at a closed port: the echo plugin answers every message that reaches it, so MaiBot's own chat
loop never runs."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
root = Path(os.environ["MAIBOT_ROOT"])
maibot = str(Path(sys.executable).parent / "maibot")
config = root / "config"
if not (config / "bot_config.toml").exists():
    subprocess.run([maibot, "init", "--directory", str(root)], check=True, stdout=subprocess.DEVNULL)


def edit(path: Path, section: str, key: str, value: str) -> None:
    """Sets `key = value` in `[section]` of a TOML file MaiBot wrote, keeping its comments."""
    text = path.read_text(encoding="utf-8")
    header = re.search(rf"^\[\[?{re.escape(section)}\]\]?", text, flags=re.M)
    if header is None:
        raise SystemExit(f"{path.name}: no [{section}]")
    start = header.start()
    end = text.find("\n[", start + 1)
    end = len(text) if end < 0 else end
    body, n = re.subn(
        rf"^{re.escape(key)} = .*$", f"{key} = {value}", text[start:end], count=1, flags=re.M
    )
    if n != 1:
        raise SystemExit(f"{path.name}: no {key} in [{section}]")
    path.write_text(text[:start] + body + text[end:], encoding="utf-8")


bot = config / "bot_config.toml"
edit(bot, "bot", "platform", '"qq"')
edit(bot, "bot", "qq_account", f'"{os.environ["MAIBOT_ACCOUNT"]}"')
edit(bot, "maim_message", "ws_server_host", '"127.0.0.1"')
edit(bot, "maim_message", "ws_server_port", os.environ["PORT"])
edit(bot, "webui", "enabled", "false")
edit(bot, "telemetry", "enable", "false")
edit(bot, "debug", "enable_console_input", "false")
models = config / "model_config.toml"
edit(models, "api_providers", "base_url", '"http://127.0.0.1:9/v1"')

plugins = root / "plugins"
plugins.mkdir(exist_ok=True)
for name, source in [("hark", here.parents[2] / "integrations" / "maibot"), ("echo", here / "echo")]:
    target = plugins / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("README.md", "__pycache__"))
(plugins / "hark" / "config.toml").write_text(
    "[plugin]\n"
    'config_version = "1.0.0"\n'
    "enabled = true\n\n"
    "[hark]\n"
    f'url = "{os.environ["HARK_URL"]}"\n'
    f'token = "{os.environ.get("HARK_TOKEN", "")}"\n'
    f'wait_ms = {int(os.environ.get("HARK_WAIT_MS", "3000"))}\n'
    f'pull_ms = {int(os.environ.get("HARK_PULL_MS", "20000"))}\n',
    encoding="utf-8",
)

# MaiBot asks its operator to accept its EULA and privacy terms on the terminal at first start.
read, write = os.pipe()
os.write(write, b"confirmed\n")
os.close(write)
os.dup2(read, 0)
os.execv(maibot, [maibot, "run", "--directory", str(root)])
