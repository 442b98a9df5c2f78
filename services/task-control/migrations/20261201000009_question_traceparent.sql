-- The span that asked each question, so that the run its answer resumes links to it.
ALTER TABLE questions ADD COLUMN traceparent text;
