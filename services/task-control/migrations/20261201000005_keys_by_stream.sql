-- The key of an inbound chat message names its stream: `platform:bot:stream:message_id`, since on
-- some platforms a message id is unique only within its chat. Keys written before name no stream;
-- each takes the stream of the question or task it was applied to, so a message delivered again
-- after the upgrade is still known.
UPDATE applied_inbound a
SET key = s.parts[1] || ':' || s.parts[2] || ':' || s.stream || ':' || s.parts[3]
FROM (
    SELECT a2.key, coalesce(q.stream, t.stream) AS stream,
           regexp_match(a2.key, '^([^:]+):([^:]*):(.*)$') AS parts
    FROM applied_inbound a2
    LEFT JOIN questions q ON q.id = a2.question_id
    LEFT JOIN tasks t ON t.id = a2.task_id
) s
WHERE s.key = a.key AND s.stream IS NOT NULL AND s.parts IS NOT NULL
  AND a.key NOT LIKE 'api:%' AND a.key NOT LIKE 'send:%'
  AND a.key NOT LIKE s.parts[1] || ':' || s.parts[2] || ':' || s.stream || ':%';

UPDATE tasks
SET request_id = platform || ':' || coalesce(bot_id, '') || ':' || stream || ':'
    || substr(request_id, length(platform || ':' || coalesce(bot_id, '') || ':') + 1)
WHERE request_id IS NOT NULL AND stream IS NOT NULL AND platform IS NOT NULL
  AND request_id LIKE platform || ':' || coalesce(bot_id, '') || ':%'
  AND request_id NOT LIKE platform || ':' || coalesce(bot_id, '') || ':' || stream || ':%';
