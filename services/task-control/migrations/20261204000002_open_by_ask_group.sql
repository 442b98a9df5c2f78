-- The open questions of an ask put to several people, found by its group when an answer closes
-- the others.
CREATE INDEX questions_open_by_ask_group ON questions (ask_group)
    WHERE outcome = 'open' AND ask_group IS NOT NULL;
