-- Columns no statement filters, sorts, groups or joins on keep no statistics. Upkeep analyzes
-- `questions` after a tenth of its rows changed (store/upkeep.rs), and an analyze spent most of
-- its time on these texts and documents: at 40,000 questions, 320-340 ms with them, 130-176 ms
-- without. The planner never reads them.
ALTER TABLE questions
    ALTER COLUMN text SET STATISTICS 0,
    ALTER COLUMN context SET STATISTICS 0,
    ALTER COLUMN answer SET STATISTICS 0,
    ALTER COLUMN model_answer SET STATISTICS 0,
    ALTER COLUMN choices SET STATISTICS 0,
    ALTER COLUMN traceparent SET STATISTICS 0,
    ALTER COLUMN tool_call_id SET STATISTICS 0,
    ALTER COLUMN answerer SET STATISTICS 0,
    ALTER COLUMN inbound_message_id SET STATISTICS 0;
ALTER TABLE tasks
    ALTER COLUMN goal SET STATISTICS 0,
    ALTER COLUMN result SET STATISTICS 0,
    ALTER COLUMN error SET STATISTICS 0,
    ALTER COLUMN questionnaire SET STATISTICS 0;
ALTER TABLE checkpoints ALTER COLUMN messages SET STATISTICS 0;
ALTER TABLE transitions ALTER COLUMN detail SET STATISTICS 0;
