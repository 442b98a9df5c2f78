"""hark's HTTP adapter as the plugin uses it: post a message and read the verdict, pull the
bot's outbound messages, and acknowledge the ones sent."""

from typing import Any, Optional

import httpx


class HarkError(Exception):
    """hark did not answer as it should; the message is left to the other handlers."""


class Hark:
    def __init__(self, url: str, token: str, platform: str):
        self.url = url.rstrip("/")
        self.platform = platform
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(40.0))

    async def post(self, message: dict, wait_ms: int) -> dict:
        """Posts a chat message; returns hark's answer, with `taken` when it gave a verdict."""
        message = {"platform": self.platform, **message}
        try:
            response = await self.http.post(
                f"{self.url}/api/v1/messages",
                params={"wait_ms": wait_ms},
                json=message,
                timeout=wait_ms / 1000 + 10,
            )
        except httpx.HTTPError as e:
            raise HarkError(f"hark at {self.url} does not answer: {e!r}") from e
        if response.status_code not in (200, 202):
            raise HarkError(f"hark refused the message ({response.status_code}): {response.text}")
        try:
            verdict = response.json()
        except ValueError:
            verdict = None
        if not isinstance(verdict, dict):
            raise HarkError(f"hark at {self.url} answered with something other than a JSON object: {response.text[:200]!r}")
        return verdict

    async def pull(self, bot_id: str, wait_ms: int) -> list:
        """The bot's pending messages, waiting up to `wait_ms` for a first one."""
        response = await self.http.get(
            f"{self.url}/api/v1/outbound",
            params={"platform": self.platform, "bot_id": bot_id, "wait_ms": wait_ms},
            timeout=wait_ms / 1000 + 10,
        )
        if response.status_code != 200:
            raise HarkError(f"hark refused the pull ({response.status_code}): {response.text}")
        return response.json()["messages"]

    async def ack(
        self,
        bot_id: str,
        ack: str,
        message_id: Optional[Any],
        failed: Optional[str] = None,
        retry: bool = True,
    ) -> bool:
        """Tells hark the message was sent, with the id the platform gave it; or with `failed`,
        that it could not be, and whether sending it again may help."""
        entry: dict = {"ack": ack}
        if message_id is not None:
            entry["message_id"] = message_id
        if failed is not None:
            entry["failed"] = failed[:500]
            entry["retry"] = retry
        response = await self.http.post(
            f"{self.url}/api/v1/outbound/ack",
            json={"platform": self.platform, "bot_id": bot_id, "acks": [entry]},
        )
        if response.status_code != 200:
            raise HarkError(f"hark refused the acknowledgement ({response.status_code}): {response.text}")
        return all(a.get("acked") for a in response.json()["acks"])

    async def close(self) -> None:
        await self.http.aclose()
