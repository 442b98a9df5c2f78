"""The plugin's settings, read by NoneBot from `.env` or the environment."""

from pydantic import BaseModel


class Config(BaseModel):
    # Where hark's gateway listens (its HTTP adapter), e.g. http://127.0.0.1:8080.
    hark_url: str = "http://127.0.0.1:8080"
    # hark's `gateway.http.token`; empty only while hark listens on loopback without one.
    hark_token: str = ""
    # The platform hark knows these chats by. It must be one of hark's `gateway.http.platforms`,
    # and each bot `<platform>:<self_id>` one of `gateway.http.bots`.
    hark_platform: str = "nonebot-onebot"
    # How long a message waits for hark's verdict before the other handlers get it (ms).
    hark_wait_ms: int = 3000
    # How long one pull of hark's messages waits for the first one (ms).
    hark_pull_ms: int = 20000
    # hark's MCP server (http://<control.http_listen>/mcp), for the tools an LLM of the bot's may
    # call (`nonebot_plugin_hark.TOOLS`); empty: the tools ask nobody.
    hark_mcp_url: str = ""
    # One of hark's `control.api_tokens`, which lets the tools name whom they ask.
    hark_mcp_token: str = ""
    # How long a tool waits for the answer before it tells the model the question stays open (s).
    hark_ask_wait_s: float = 50.0
