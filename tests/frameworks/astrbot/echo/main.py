from astrbot.api.event import AstrMessageEvent, filter
from astrbot.api.star import Context, Star


class Echo(Star):
    """The bot's own handler: it answers every message that reaches it."""

    def __init__(self, context: Context):
        super().__init__(context)

    @filter.event_message_type(filter.EventMessageType.ALL)
    async def echo(self, event: AstrMessageEvent):
        yield event.plain_result(f"echo: {event.message_obj.message_str}")
