"""MaiBot as its users run it, without its web UI: `maibot run` on an instance directory made by
`maibot init`, its maim_message WebSocket (where a platform adapter such as the Napcat adapter
connects) on PORT, hark's plugin from integrations/maibot and an echo plugin of the bot's own,
loaded from the instance's plugins/ by MaiBot's plugin runner.

MAIBOT_ROOT is a fresh directory; HARK_* become the hark plugin's config.toml. Without
MAIBOT_LLM_URL the models point at a closed port: the echo plugin answers every message that
reaches it, so MaiBot's own chat loop never runs. With it, MaiBot's planner (its agent, which
calls tools) is an OpenAI-compatible server there, its other models one at MAIBOT_REPLYER_URL,
and MaiBot's chat loop is the bot's handler instead of the echo plugin."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomlkit

here = Path(__file__).resolve().parent
root = Path(os.environ["MAIBOT_ROOT"])
maibot = str(Path(sys.executable).parent / "maibot")
config = root / "config"
if not (config / "bot_config.toml").exists():
    subprocess.run([maibot, "init", "--directory", str(root)], check=True, stdout=subprocess.DEVNULL)


def update(path: Path, change) -> None:
    """Changes a TOML file MaiBot wrote, keeping its comments."""
    document = tomlkit.parse(path.read_text(encoding="utf-8"))
    change(document)
    path.write_text(tomlkit.dumps(document), encoding="utf-8")


def bot_settings(bot) -> None:
    bot["bot"]["platform"] = "qq"
    bot["bot"]["qq_account"] = os.environ["MAIBOT_ACCOUNT"]
    bot["maim_message"]["ws_server_host"] = "127.0.0.1"
    bot["maim_message"]["ws_server_port"] = int(os.environ["PORT"])
    bot["webui"]["enabled"] = False
    bot["telemetry"]["enable"] = False
    bot["debug"]["enable_console_input"] = False


# The planner (MaiBot's agent, which calls tools) asks MAIBOT_LLM_URL; every other model task
# (the replyer that writes what MaiBot says, summaries, learning) asks MAIBOT_REPLYER_URL.
llm_url = os.environ.get("MAIBOT_LLM_URL", "")


def model_settings(models) -> None:
    provider = models["api_providers"][0]
    provider["base_url"] = os.environ.get("MAIBOT_REPLYER_URL") or "http://127.0.0.1:9/v1"
    if not llm_url:
        return
    planner_provider = tomlkit.table()
    planner_provider.update({**provider.unwrap(), "name": "planner", "base_url": llm_url})
    models["api_providers"].append(planner_provider)
    planner = tomlkit.table()
    planner.update({**models["models"][0].unwrap(), "name": "planner", "api_provider": "planner"})
    planner["extra_params"] = {}
    models["models"].append(planner)
    models["model_task_config"]["planner"]["model_list"] = ["planner"]


update(config / "bot_config.toml", bot_settings)
update(config / "model_config.toml", model_settings)

plugins = root / "plugins"
plugins.mkdir(exist_ok=True)
installed = [("hark", here.parents[2] / "integrations" / "maibot")]
if not llm_url:
    installed.append(("echo", here / "echo"))
for name, source in installed:
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
    f'pull_ms = {int(os.environ.get("HARK_PULL_MS", "20000"))}\n'
    f'mcp_url = "{os.environ.get("HARK_MCP_URL", "")}"\n'
    f'mcp_token = "{os.environ.get("HARK_MCP_TOKEN", "")}"\n'
    f'ask_wait_s = {float(os.environ.get("HARK_ASK_WAIT_S", "50"))}\n',
    encoding="utf-8",
)

# MaiBot asks its operator to accept its EULA and privacy terms on the terminal at first start.
read, write = os.pipe()
os.write(write, b"confirmed\n")
os.close(write)
os.dup2(read, 0)
os.execv(maibot, [maibot, "run", "--directory", str(root)])
